from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest
from qdrant_client import QdrantClient, models

from ragrank.errors import (
    CollectionMismatchError,
    SettingsError,
    StoreError,
    StoreUnreachableError,
)
from ragrank.settings import Settings
from ragrank.store import EdgeStore, ServerStore, Store, open_store, point_id
from tests.data import make_chunks, unit

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture(params=["edge", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Both engines behind the one interface: Qdrant Edge in a folder, and qdrant-client
    against a server (its local mode stands in for the server here: no Qdrant binary
    installs in CI)."""
    if request.param == "edge":
        store: Store = open_store(Settings(qdrant_path=tmp_path / "q", collection="c"))
    else:
        store = ServerStore(QdrantClient(":memory:"), "c")
    yield store
    store.close()


def test_point_ids_are_deterministic_and_distinct():
    assert point_id("a", 0) == point_id("a", 0)
    assert len({point_id("a", 0), point_id("a", 1), point_id("b", 0), point_id("a0", 0)}) == 4
    # Ids that would collide under naive string joining stay distinct.
    assert point_id("a#1", 0) != point_id("a", 10)


def test_collection_is_created_once_and_answers(store: Store):
    assert not store.ping()
    store.ensure_collection(8)
    store.ensure_collection(8)  # idempotent
    assert store.ping() and store.count() == 0


def test_a_dimension_mismatch_is_refused_with_a_clear_error(store: Store):
    store.ensure_collection(8)
    with pytest.raises(CollectionMismatchError, match=r"8-d.*16-d.*RAGRANK_COLLECTION"):
        store.ensure_collection(16)


def test_an_embedded_collection_keeps_its_dimension_across_restarts(tmp_path: Path):
    settings = Settings(qdrant_path=tmp_path / "q", collection="c")
    first = open_store(settings)
    first.ensure_collection(8)
    first.upsert(make_chunks(3), unit(3, 8))
    first.close()
    again = open_store(settings)
    try:
        assert again.count() == 3
        with pytest.raises(CollectionMismatchError, match=r"8-d.*16-d"):
            again.ensure_collection(16)
    finally:
        again.close()


def test_a_distance_mismatch_on_a_server_is_refused():
    client = QdrantClient(":memory:")
    client.create_collection(
        "dots", vectors_config=models.VectorParams(size=8, distance=models.Distance.DOT)
    )
    store = ServerStore(client, "dots")
    with pytest.raises(CollectionMismatchError, match="Dot"):
        store.ensure_collection(8)
    store.close()


def test_upserting_the_same_chunks_twice_does_not_duplicate(store: Store):
    store.ensure_collection(8)
    chunks = make_chunks(5)
    store.upsert(chunks, unit(5, 8))
    store.upsert(chunks, unit(5, 8, seed=1))
    assert store.count() == 5


def test_search_returns_payload_fields_best_first(store: Store):
    store.ensure_collection(8)
    vectors = unit(5, 8)
    store.upsert(make_chunks(5, lang="de"), vectors)
    hits = store.search(vectors[3], limit=3)
    assert hits[0].chunk.chunk_index == 3
    assert hits[0].retrieval_score == pytest.approx(1.0, abs=1e-5)
    assert [h.retrieval_score for h in hits] == sorted(
        (h.retrieval_score for h in hits), reverse=True
    )
    top = hits[0].chunk
    assert (top.doc_id, top.text, top.title, dict(top.metadata)) == (
        "doc",
        "text 3",
        "T",
        {"lang": "de"},
    )
    assert (top.start, top.end) == (30, 36)


def test_filters_match_doc_id_and_metadata(store: Store):
    store.ensure_collection(8)
    store.upsert(
        make_chunks(3, "a", lang="de", year=2020, score=0.5, draft=True), unit(3, 8, seed=2)
    )
    store.upsert(
        make_chunks(3, "b", lang="fr", year=2021, score=1.5, draft=None), unit(3, 8, seed=3)
    )
    query = unit(1, 8, seed=4)[0]

    def docs(where: dict[str, object]) -> set[str]:
        return {h.chunk.doc_id for h in store.search(query, 10, where)}  # type: ignore[arg-type]

    assert docs({"doc_id": "b"}) == {"b"}
    assert docs({"lang": "de"}) == {"a"}
    assert docs({"year": 2021}) == {"b"}
    assert docs({"score": 0.5}) == {"a"}
    assert docs({"draft": True}) == {"a"}
    assert docs({"draft": None}) == {"b"}
    assert store.search(query, 10, {"lang": "de", "doc_id": "b"}) == []


def test_document_bookkeeping_has_the_same_semantics_on_both_engines(store: Store):
    """Stamps read back, tails and whole documents deleted, origins listed, across more
    points than one scroll page."""
    from ragrank.store import DocumentStamp

    store.ensure_collection(4)
    stamp = DocumentStamp("h1", 1100, origin="/docs")
    store.upsert(make_chunks(1100, "big"), unit(1100, 4), {"big": stamp})
    store.upsert(make_chunks(2, "small"), unit(2, 4, seed=1), {"small": DocumentStamp("h2", 2)})
    stored = store.stored_documents(["big", "small", "absent"])
    assert set(stored) == {"big", "small"}
    assert stored["big"].holds_version("h1", "/docs")
    assert not stored["big"].holds_version("h1", "/elsewhere")
    assert store.documents_from("/docs") == {"big"}

    store.delete_tails({"big": 1000, "small": 5})
    assert store.stored_documents(["big"])["big"].chunks == set(range(1000))
    assert store.count() == 1002
    store.delete_documents(["big"])
    assert store.count() == 2 and store.documents_from("/docs") == set()


def test_points_come_back_with_their_ids_vectors_and_payloads(store: Store):
    store.ensure_collection(4)
    vectors = unit(300, 4)
    store.upsert(make_chunks(300), vectors)
    points = [point for batch in store.points(batch=128) for point in batch]
    assert sorted(p.id for p in points) == sorted(point_id("doc", i) for i in range(300))
    by_chunk = {int(p.payload["chunk"]): p for p in points}
    assert by_chunk[7].payload["text"] == "text 7"
    np.testing.assert_allclose(by_chunk[7].vector, vectors[7], atol=1e-6)


def test_payload_indexes_are_made_by_both_engines(tmp_path: Path):
    expected = ["doc_id", "origin", "metadata.lang", "metadata.team"]
    embedded = open_store(Settings(qdrant_path=tmp_path / "q"))
    try:
        embedded.ensure_collection(4)
        embedded.ensure_payload_indexes(("lang", "team"))
        embedded.ensure_payload_indexes(("lang", "team"))  # idempotent
        assert isinstance(embedded, EdgeStore)
        assert sorted(embedded._open().info().payload_schema) == sorted(expected)
    finally:
        embedded.close()

    indexed: list[tuple[str, object]] = []

    class RecordingClient:  # the local-mode stand-in keeps no payload index to show
        def create_payload_index(self, collection: str, *, field_name, field_schema, wait):
            indexed.append((field_name, field_schema))

    ServerStore(RecordingClient(), "c").ensure_payload_indexes(("lang", "team"))  # type: ignore[arg-type]
    assert indexed == [(name, models.PayloadSchemaType.KEYWORD) for name in expected]


def test_a_locked_embedded_folder_names_the_way_out(tmp_path: Path):
    holder = open_store(Settings(qdrant_path=tmp_path / "q"))
    try:
        with pytest.raises(StoreError, match="RAGRANK_QDRANT_URL"):
            open_store(Settings(qdrant_path=tmp_path / "q"))
    finally:
        holder.close()
    open_store(Settings(qdrant_path=tmp_path / "q")).close()  # free once the holder closed


def test_an_unreachable_server_reports_not_ready():
    store = open_store(Settings(qdrant_url="http://127.0.0.1:9"))
    assert not store.ping()
    with pytest.raises(StoreError):
        store.count()
    store.close()


def test_unindexed_points_are_searched_exactly_and_optimize_builds_the_graph(tmp_path: Path):
    """Until `optimize`, new points sit in a segment without a graph and every search is
    exact; after it, the graph answers (at a wide `ef`, with the exact neighbours)."""
    from ragrank.store import IndexTuning

    tuning = IndexTuning(indexing_threshold_kb=1, full_scan_threshold_kb=1, ef=256)
    store = EdgeStore(tmp_path / "q", "c", tuning=tuning)
    try:
        store.ensure_collection(16)
        vectors = unit(3000, 16)
        for start in range(0, 3000, 500):
            store.upsert(make_chunks(500, f"d{start}"), vectors[start : start + 500])
        assert store.unindexed() == 3000
        queries = unit(20, 16, seed=9)

        def ids(exact: bool) -> list[list[str]]:
            return [
                [
                    f"{h.chunk.doc_id}/{h.chunk.chunk_index}"
                    for h in store.search(q, 10, exact=exact)
                ]
                for q in queries
            ]

        exact = ids(True)
        assert ids(False) == exact
        store.optimize()
        assert store.unindexed() == 0
        found = sum(len(set(a) & set(e)) for a, e in zip(ids(False), exact, strict=True))
        assert found >= 0.95 * 200
    finally:
        store.close()


def test_searches_answer_while_a_writer_writes(tmp_path: Path):
    """The in-process worker and the searches share one shard: every search answers, and the
    count ends at what was written."""
    import threading

    store = open_store(Settings(qdrant_path=tmp_path / "q", collection="c"))
    store.ensure_collection(8)
    store.upsert(make_chunks(10, "seed"), unit(10, 8))
    errors: list[BaseException] = []
    answered = [0]

    def write() -> None:
        try:
            for batch in range(40):
                store.upsert(make_chunks(25, f"w{batch}"), unit(25, 8, seed=batch))
        except BaseException as exc:
            errors.append(exc)

    def search(seed: int) -> None:
        try:
            while writer.is_alive():
                assert len(store.search(unit(1, 8, seed=seed)[0], 5)) == 5
                answered[0] += 1
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    readers = [threading.Thread(target=search, args=(seed,)) for seed in (1, 2)]
    writer.start()
    for reader in readers:
        reader.start()
    writer.join()
    for reader in readers:
        reader.join()
    try:
        assert errors == []
        assert answered[0] > 0 and store.count() == 10 + 40 * 25
    finally:
        store.close()


def test_a_new_collection_on_a_server_gets_the_layout_and_index_settings():
    settings = Settings(
        qdrant_url="http://qdrant:6333",
        qdrant_shard_number=6,
        qdrant_replication_factor=2,
        qdrant_write_consistency_factor=2,
        hnsw_m=24,
        hnsw_ef_construct=200,
    )
    created: list[dict[str, object]] = []

    class RecordingClient:
        def collection_exists(self, collection: str) -> bool:
            return False

        def create_collection(self, collection: str, **arguments: object) -> None:
            created.append(arguments)

    template = ServerStore.from_settings(settings)
    server = ServerStore(
        RecordingClient(),  # type: ignore[arg-type]
        "c",
        layout=template.layout,
        tuning=template.tuning,
    )
    server.ensure_collection(8)
    (arguments,) = created
    assert (arguments["shard_number"], arguments["replication_factor"]) == (6, 2)
    assert arguments["write_consistency_factor"] == 2
    assert arguments["vectors_config"] == models.VectorParams(
        size=8, distance=models.Distance.COSINE
    )
    hnsw = arguments["hnsw_config"]
    assert isinstance(hnsw, models.HnswConfigDiff) and (hnsw.m, hnsw.ef_construct) == (24, 200)


def test_metadata_index_keys_come_from_a_comma_separated_setting():
    settings = Settings.from_env({"RAGRANK_METADATA_INDEXES": " lang, team ,"})
    assert settings.metadata_index_keys == ("lang", "team")
    assert Settings().metadata_index_keys == ()


class RacingClient(QdrantClient):
    """An in-memory Qdrant where another process (a second API replica) creates the collection
    between this process's existence check and its own create."""

    def __init__(self, dimension: int) -> None:
        super().__init__(":memory:")
        self.other_dimension = dimension
        self.raced = False

    def collection_exists(self, collection_name: str, **kwargs) -> bool:
        if not self.raced:
            self.raced = True
            super().create_collection(
                collection_name,
                vectors_config=models.VectorParams(
                    size=self.other_dimension, distance=models.Distance.COSINE
                ),
                sparse_vectors_config={
                    "bm25": models.SparseVectorParams(modifier=models.Modifier.IDF)
                },
            )
            return False
        return super().collection_exists(collection_name, **kwargs)


def test_replicas_starting_together_share_the_collection_one_of_them_created():
    client = RacingClient(dimension=8)
    ServerStore(client, "c").ensure_collection(8)  # the losing create is not an error
    assert client.raced and client.get_collection("c").config.params.vectors.size == 8

    mismatched = RacingClient(dimension=16)
    with pytest.raises(CollectionMismatchError, match="16-d"):
        ServerStore(mismatched, "c").ensure_collection(8)


def test_a_write_cannot_wait_for_more_copies_than_exist():
    with pytest.raises(SettingsError, match="RAGRANK_QDRANT_WRITE_CONSISTENCY_FACTOR"):
        Settings(qdrant_replication_factor=2, qdrant_write_consistency_factor=3)
    with pytest.raises(SettingsError, match="RAGRANK_QDRANT_SHARD_NUMBER"):
        Settings(qdrant_shard_number=0)
    with pytest.raises(SettingsError, match="RAGRANK_HNSW_EF"):
        Settings(hnsw_ef=0)


def test_a_remote_server_gets_the_api_key_on_every_request():
    """Qdrant Cloud and other remote servers: URL plus API key from the settings (an https URL
    makes qdrant-client use TLS; this local stand-in speaks plain HTTP)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str | None]] = []

    class FakeQdrant(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("api-key")))
            body = json.dumps({"result": {"exists": True}, "status": "ok", "time": 0.0}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeQdrant)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        store = open_store(Settings(qdrant_url=url, qdrant_api_key="s3cret", collection="docs"))
        assert store.ping()
        store.close()
    finally:
        server.shutdown()
    # qdrant-client may also probe the server's version (`GET /`), which carries the key too.
    assert ("/collections/docs/exists", "s3cret") in seen
    assert {key for _, key in seen} == {"s3cret"} and {path for path, _ in seen} <= {
        "/collections/docs/exists",
        "/",
    }


def test_failures_worth_retrying_are_told_apart_from_refusals():
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    def failing(exc: Exception):
        def call() -> None:
            raise exc

        return call

    store = ServerStore(QdrantClient(":memory:"), "c")
    transient = [
        ResponseHandlingException(ConnectionRefusedError("refused")),
        UnexpectedResponse(503, "Service Unavailable", b"", httpx.Headers()),
        UnexpectedResponse(429, "Too Many Requests", b"", httpx.Headers()),
        ConnectionResetError("reset"),
    ]
    for exc in transient:
        with pytest.raises(StoreUnreachableError):
            store._call(failing(exc))
    for exc in (UnexpectedResponse(400, "Bad Request", b"", httpx.Headers()), ValueError("x")):
        with pytest.raises(StoreError) as raised:
            store._call(failing(exc))
        assert not isinstance(raised.value, StoreUnreachableError)
