from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from qdrant_client import QdrantClient, models

from ragrank.documents import Chunk
from ragrank.errors import (
    CollectionMismatchError,
    SettingsError,
    StoreError,
    StoreUnreachableError,
)
from ragrank.settings import Settings
from ragrank.store import QdrantStore, point_id


@pytest.fixture
def store(tmp_path: Path):
    store = QdrantStore.from_settings(Settings(qdrant_path=tmp_path / "q", collection="c"))
    yield store
    store.close()


def _chunks(n: int, doc_id: str = "doc", **metadata: object) -> list[Chunk]:
    return [
        Chunk(
            doc_id=doc_id,
            chunk_index=i,
            text=f"text {i}",
            title="T",
            metadata=metadata,
            start=i * 10,
            end=i * 10 + 6,
        )
        for i in range(n)
    ]


def _unit(rows: int, dim: int, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_point_ids_are_deterministic_and_distinct():
    assert point_id("a", 0) == point_id("a", 0)
    assert len({point_id("a", 0), point_id("a", 1), point_id("b", 0), point_id("a0", 0)}) == 4
    # Ids that would collide under naive string joining stay distinct.
    assert point_id("a#1", 0) != point_id("a", 10)


def test_collection_is_created_with_cosine_and_the_model_dimension(store: QdrantStore):
    store.ensure_collection(8)
    store.ensure_collection(8)  # idempotent
    info = store._client.get_collection("c")
    assert info.config.params.vectors.size == 8
    assert info.config.params.vectors.distance == models.Distance.COSINE
    assert store.ping()


def test_a_dimension_mismatch_is_refused_with_a_clear_error(store: QdrantStore):
    store.ensure_collection(8)
    with pytest.raises(CollectionMismatchError, match=r"8-d.*16-d.*RAGRANK_COLLECTION"):
        store.ensure_collection(16)


def test_a_distance_mismatch_is_refused(tmp_path: Path):
    client = QdrantClient(path=str(tmp_path / "q2"))
    client.create_collection(
        "dots", vectors_config=models.VectorParams(size=8, distance=models.Distance.DOT)
    )
    store = QdrantStore(client, "dots")
    with pytest.raises(CollectionMismatchError, match="Dot"):
        store.ensure_collection(8)
    store.close()


def test_upserting_the_same_chunks_twice_does_not_duplicate(store: QdrantStore):
    store.ensure_collection(8)
    chunks = _chunks(5)
    store.upsert(chunks, _unit(5, 8))
    store.upsert(chunks, _unit(5, 8, seed=1))
    assert store.count() == 5


def test_search_returns_payload_fields_best_first(store: QdrantStore):
    store.ensure_collection(8)
    vectors = _unit(5, 8)
    store.upsert(_chunks(5, lang="de"), vectors)
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


def test_filters_match_doc_id_and_metadata(store: QdrantStore):
    store.ensure_collection(8)
    store.upsert(_chunks(3, "a", lang="de", year=2020), _unit(3, 8, seed=2))
    store.upsert(_chunks(3, "b", lang="fr", year=2021), _unit(3, 8, seed=3))
    query = _unit(1, 8, seed=4)[0]
    assert {h.chunk.doc_id for h in store.search(query, 10, {"doc_id": "b"})} == {"b"}
    assert {h.chunk.doc_id for h in store.search(query, 10, {"lang": "de"})} == {"a"}
    assert {h.chunk.doc_id for h in store.search(query, 10, {"year": 2021})} == {"b"}
    assert store.search(query, 10, {"lang": "de", "doc_id": "b"}) == []


def test_a_locked_embedded_folder_names_the_way_out(store: QdrantStore, tmp_path: Path):
    # The fixture's client holds tmp_path / "q"; a second client in this process is refused.
    with pytest.raises(StoreError, match="RAGRANK_QDRANT_URL"):
        QdrantStore.from_settings(Settings(qdrant_path=tmp_path / "q"))


def test_an_unreachable_server_reports_not_ready():
    store = QdrantStore.from_settings(Settings(qdrant_url="http://127.0.0.1:9"))
    assert not store.ping()
    with pytest.raises(StoreError):
        store.count()
    store.close()


class RecordingClient:
    """Records the payload indexes and collections asked for (the embedded client has no
    payload indexes or shards to show)."""

    def __init__(self) -> None:
        self.indexed: list[tuple[str, object]] = []
        self.created: list[dict[str, object]] = []

    def collection_exists(self, collection: str) -> bool:
        return False

    def create_collection(self, collection: str, **arguments) -> None:
        self.created.append(arguments)

    def create_payload_index(self, collection: str, *, field_name: str, field_schema, wait):
        self.indexed.append((field_name, field_schema))


def test_payload_indexes_are_created_on_a_server_only():
    client = RecordingClient()
    server = QdrantStore(client, "c", embedded=False)  # type: ignore[arg-type]
    server.ensure_payload_indexes(("lang", "team"))
    assert client.indexed == [
        (name, models.PayloadSchemaType.KEYWORD)
        for name in ("doc_id", "origin", "metadata.lang", "metadata.team")
    ]
    embedded_client = RecordingClient()
    QdrantStore(embedded_client, "c", embedded=True).ensure_payload_indexes(("lang",))  # type: ignore[arg-type]
    assert embedded_client.indexed == []


def test_metadata_index_keys_come_from_a_comma_separated_setting():
    settings = Settings.from_env({"RAGRANK_METADATA_INDEXES": " lang, team ,"})
    assert settings.metadata_index_keys == ("lang", "team")
    assert Settings().metadata_index_keys == ()


def test_a_new_collection_on_a_server_gets_the_cluster_layout_from_the_settings():
    settings = Settings(
        qdrant_url="http://qdrant:6333",
        qdrant_shard_number=6,
        qdrant_replication_factor=2,
        qdrant_write_consistency_factor=2,
    )
    client = RecordingClient()
    layout = QdrantStore.from_settings(settings).layout
    QdrantStore(client, "c", embedded=False, layout=layout).ensure_collection(8)  # type: ignore[arg-type]
    (created,) = client.created
    assert (created["shard_number"], created["replication_factor"]) == (6, 2)
    assert created["write_consistency_factor"] == 2
    assert created["vectors_config"] == models.VectorParams(size=8, distance=models.Distance.COSINE)

    embedded = RecordingClient()
    QdrantStore(embedded, "c", embedded=True, layout=layout).ensure_collection(8)  # type: ignore[arg-type]
    assert embedded.created[0]["shard_number"] is None


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
            )
            return False
        return super().collection_exists(collection_name, **kwargs)


def test_replicas_starting_together_share_the_collection_one_of_them_created():
    client = RacingClient(dimension=8)
    QdrantStore(client, "c").ensure_collection(8)  # the losing create is not an error
    assert client.raced and client.get_collection("c").config.params.vectors.size == 8

    mismatched = RacingClient(dimension=16)
    with pytest.raises(CollectionMismatchError, match="16-d"):
        QdrantStore(mismatched, "c").ensure_collection(8)


def test_a_write_cannot_wait_for_more_copies_than_exist():
    with pytest.raises(SettingsError, match="RAGRANK_QDRANT_WRITE_CONSISTENCY_FACTOR"):
        Settings(qdrant_replication_factor=2, qdrant_write_consistency_factor=3)
    with pytest.raises(SettingsError, match="RAGRANK_QDRANT_SHARD_NUMBER"):
        Settings(qdrant_shard_number=0)


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
        store = QdrantStore.from_settings(
            Settings(qdrant_url=url, qdrant_api_key="s3cret", collection="docs")
        )
        assert store.ping()
        store.close()
    finally:
        server.shutdown()
    assert seen == [("/collections/docs/exists", "s3cret")]


def test_failures_worth_retrying_are_told_apart_from_refusals():
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    def failing(exc: Exception):
        def call() -> None:
            raise exc

        return call

    store = QdrantStore(QdrantClient(":memory:"), "c")
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
