"""BM25 sparse vectors and hybrid retrieval on both store engines: the weights and the scores
against hand computation, IDF through updates and deletes, fusion against a hand-fused list,
old collections, and vectors of any text."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pytest
from qdrant_client import QdrantClient

from cli import main
from ragrank.documents import Chunk
from ragrank.errors import SettingsError, SparseVectorsMissingError
from ragrank.settings import Settings
from ragrank.sparse import Bm25Params, QdrantBm25, SparseVector, sparse_encoder
from ragrank.store import EdgeStore, Fusion, IndexTuning, ServerStore, Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

PARAMS = Bm25Params(k=1.2, b=0.75, avg_len=4.0)
#: Words the English stopword list and stemmer leave as they are.
CORPUS = {
    "a": "quartz granite quartz",
    "b": "granite basalt",
    "c": "basalt obsidian pumice basalt basalt",
}


#: Every segment gets a graph, so that writes also meet built (immutable) segments.
BUILT = IndexTuning(indexing_threshold_kb=1, full_scan_threshold_kb=1)


def _store(engine: str, tmp_path: Path, *, sparse: bool = True) -> Store:
    if engine == "edge":
        return EdgeStore(tmp_path / "q", "c", sparse=sparse, tuning=BUILT)
    return ServerStore(QdrantClient(":memory:"), "c", sparse=sparse)


@pytest.fixture(params=["edge", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    store = _store(request.param, tmp_path)
    yield store
    store.close()


def _index(store: Store, texts: dict[str, str], encoder: QdrantBm25, seed: int = 0) -> None:
    store.ensure_collection(4)
    chunks = [Chunk(doc_id=doc_id, chunk_index=0, text=text) for doc_id, text in texts.items()]
    vectors = np.random.default_rng(seed).normal(size=(len(chunks), 4)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store.upsert(chunks, vectors, sparse=encoder.documents([c.passage for c in chunks]))


def hand_bm25(query: str, corpus: dict[str, str]) -> dict[str, float]:
    """BM25 of each document, from the textbook formulas (whitespace terms)."""
    documents = {doc_id: text.split() for doc_id, text in corpus.items()}
    total = len(documents)
    scores = {}
    for doc_id, terms in documents.items():
        score = 0.0
        for term in set(query.split()):
            tf = terms.count(term)
            if not tf:
                continue
            holding = sum(term in other for other in documents.values())
            idf = math.log(1 + (total - holding + 0.5) / (holding + 0.5))
            norm = 1 - PARAMS.b + PARAMS.b * len(terms) / PARAMS.avg_len
            score += idf * tf * (PARAMS.k + 1) / (tf + PARAMS.k * norm)
        if score:
            scores[doc_id] = score
    return scores


def test_document_weights_are_bm25_term_frequencies():
    encoder = QdrantBm25(PARAMS, "english")
    (vector,) = encoder.documents(["quartz granite quartz"])
    # Two distinct terms in a 3-term document: tf 2 and tf 1.
    norm = 1 - 0.75 + 0.75 * 3 / 4.0
    expected = sorted([2 * 2.2 / (2 + 1.2 * norm), 1 * 2.2 / (1 + 1.2 * norm)])
    assert sorted(vector.values) == pytest.approx(expected)
    assert list(vector.indices) == sorted(vector.indices)
    query = encoder.query("quartz quartz granite").vector
    assert query.values == (1.0, 1.0) and set(query.indices) == set(vector.indices)


def test_sparse_search_scores_are_bm25_with_qdrant_idf(store: Store):
    encoder = QdrantBm25(PARAMS, "english")
    _index(store, CORPUS, encoder)
    hits = store.search(None, 10, sparse=encoder.query("basalt quartz").vector)
    found = {hit.chunk.doc_id: hit.retrieval_score for hit in hits}
    assert found == pytest.approx(hand_bm25("basalt quartz", CORPUS), rel=1e-4)


def test_idf_follows_updates_and_deletes(store: Store):
    """Qdrant counts the points a segment still holds, deleted ones included, until the
    segment is rebuilt: the store's build after writes (as `ragrank index` ends) rebuilds it."""
    encoder = QdrantBm25(PARAMS, "english")
    _index(store, CORPUS, encoder)
    store.optimize()
    changed = {**CORPUS, "b": "pumice obsidian"}
    _index(store, {"b": changed["b"]}, encoder)
    store.delete_tails({"b": 1})
    store.optimize()
    query = "basalt pumice"
    hits = store.search(None, 10, sparse=encoder.query(query).vector)
    assert {h.chunk.doc_id: h.retrieval_score for h in hits} == pytest.approx(
        hand_bm25(query, changed), rel=1e-4
    )
    store.delete_documents(["c"])
    store.optimize()
    remaining = {k: v for k, v in changed.items() if k != "c"}
    hits = store.search(None, 10, sparse=encoder.query(query).vector)
    assert {h.chunk.doc_id: h.retrieval_score for h in hits} == pytest.approx(
        hand_bm25(query, remaining), rel=1e-4
    )


@pytest.mark.parametrize(
    ("k", "weights"), [(2, (1.0, 1.0)), (60, (1.0, 1.0)), (60, (2.0, 1.0)), (10, (1.0, 0.5))]
)
def test_rrf_fuses_as_hand_fused(store: Store, k: int, weights: tuple[float, float]):
    encoder = QdrantBm25(PARAMS, "english")
    texts = {f"d{i}": " ".join(["granite"] * (i % 3 + 1) + ["basalt"] * (i % 4)) for i in range(12)}
    _index(store, texts, encoder, seed=3)
    query_vector = np.random.default_rng(9).normal(size=4).astype(np.float32)
    query_sparse = encoder.query("granite basalt").vector
    limit = 6
    dense = [h.chunk.doc_id for h in store.search(query_vector, limit)]
    lexical = [h.chunk.doc_id for h in store.search(None, limit, sparse=query_sparse)]
    fused: dict[str, float] = {}
    for ranking, w in zip((dense, lexical), weights, strict=True):
        for rank, doc_id in enumerate(ranking):
            # Qdrant's weighted RRF: the 1-based position divided by the list's weight.
            fused[doc_id] = fused.get(doc_id, 0.0) + 1 / (k + (rank + 1) / w - 1)
    expected = sorted(fused, key=lambda d: (-fused[d], d))[:limit]
    hits = store.search(query_vector, limit, sparse=query_sparse, fusion=Fusion("rrf", k, *weights))
    assert [h.chunk.doc_id for h in hits] == expected
    assert [h.retrieval_score for h in hits] == pytest.approx([fused[d] for d in expected])
    dbsf = store.search(query_vector, limit, sparse=query_sparse, fusion=Fusion("dbsf"))
    assert len(dbsf) == limit and set(h.chunk.doc_id for h in dbsf) <= set(dense) | set(lexical)


def test_hybrid_applies_the_filter_to_both_lists(store: Store):
    encoder = QdrantBm25(PARAMS, "english")
    store.ensure_collection(4)
    chunks = [
        Chunk(doc_id=f"d{i}", chunk_index=0, text="granite basalt", metadata={"lang": lang})
        for i, lang in enumerate(["en", "de"] * 5)
    ]
    vectors = np.ones((10, 4), dtype=np.float32) / 2
    store.upsert(chunks, vectors, sparse=encoder.documents([c.passage for c in chunks]))
    hits = store.search(vectors[0], 10, {"lang": "de"}, sparse=encoder.query("granite").vector)
    assert len(hits) == 5 and all(h.chunk.metadata["lang"] == "de" for h in hits)


@pytest.mark.parametrize("engine", ["edge", "server"])
def test_an_old_collection_is_refused_with_the_command_that_adds_sparse(
    engine: str, tmp_path: Path
):
    old = _store(engine, tmp_path, sparse=False)
    old.ensure_collection(4)
    chunks = [Chunk(doc_id=d, chunk_index=0, text=t, title="") for d, t in CORPUS.items()]
    vectors = np.eye(3, 4, dtype=np.float32)
    old.upsert(chunks, vectors)
    if engine == "edge":
        old.close()
        current = _store(engine, tmp_path)
    else:
        current = ServerStore(old._client, "c")  # type: ignore[attr-defined]
    with pytest.raises(SparseVectorsMissingError, match="ragrank store add-sparse"):
        current.ensure_collection(4)
    with pytest.raises(SparseVectorsMissingError, match="RAGRANK_SPARSE=none"):
        current.search(vectors[0], 3, sparse=SparseVector((1,), (1.0,)))
    encoder = QdrantBm25(PARAMS, "english")
    assert current.add_sparse(encoder) == 3
    current.ensure_collection(4)
    hits = current.search(None, 10, sparse=encoder.query("basalt quartz").vector)
    assert {h.chunk.doc_id: h.retrieval_score for h in hits} == pytest.approx(
        hand_bm25("basalt quartz", CORPUS), rel=1e-4
    )
    # The dense vectors are kept as they were.
    assert [h.chunk.doc_id for h in current.search(vectors[2], 1)] == ["c"]
    stored = current.stored_documents(["a"])["a"]
    assert {s.sparse for s in stored.stamps} != {""}
    current.close()


def test_store_add_sparse_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    old = EdgeStore(tmp_path / "q", "ragrank", sparse=False)
    old.ensure_collection(4)
    chunks = [Chunk(doc_id=d, chunk_index=0, text=t) for d, t in CORPUS.items()]
    old.upsert(chunks, np.eye(3, 4, dtype=np.float32))
    old.close()
    monkeypatch.setenv("RAGRANK_QDRANT_PATH", str(tmp_path / "q"))
    monkeypatch.setenv("RAGRANK_BM25_AVG_LEN", "4")
    monkeypatch.setenv("RAGRANK_BM25_LANGUAGE", "english")
    assert main(["store", "add-sparse", "--no-progress"]) == 0
    assert "3 points" in capsys.readouterr().out
    store = EdgeStore(tmp_path / "q", "ragrank")
    store.ensure_collection(4)
    hits = store.search(None, 10, sparse=QdrantBm25(PARAMS, "english").query("obsidian").vector)
    assert [h.chunk.doc_id for h in hits] == ["c"]
    store.close()


def test_sparse_settings_are_checked():
    with pytest.raises(SettingsError, match="RAGRANK_BM25_B"):
        sparse_encoder(Settings(bm25_b=1.5))
    with pytest.raises(SettingsError, match="RAGRANK_BM25_LANGUAGE"):
        sparse_encoder(Settings(bm25_language="klingon"))
    with pytest.raises(SettingsError, match="RAGRANK_RETRIEVAL=dense"):
        Settings(sparse="none")
    assert sparse_encoder(Settings(sparse="none", retrieval="dense")) is None
    assert sparse_encoder(Settings()).recipe != sparse_encoder(Settings(bm25_k=2.0)).recipe  # type: ignore[union-attr]


_ENCODERS = {"bm25": QdrantBm25(Bm25Params(), "english"), "none": QdrantBm25(Bm25Params(), "none")}


def _languages_corpus(store: Store, encoder: QdrantBm25) -> np.ndarray:
    """English passages that share the query's words, each a little less near it by the dense
    vector, and one German passage, the query's translation, nearest of all; returns the
    query's dense vector."""
    store.ensure_collection(4)
    texts = [" ".join(["granite"] * (i + 1) + ["basalt"] * (i % 3)) for i in range(8)]
    chunks = [
        Chunk(doc_id=f"en{i}", chunk_index=0, text=text, metadata={"lang": "en"})
        for i, text in enumerate(texts)
    ]
    chunks.append(Chunk(doc_id="de", chunk_index=0, text="Gestein", metadata={"lang": "de"}))
    angles = [0.5 + 0.1 * i for i in range(8)] + [0.1]
    vectors = np.array([[math.cos(a), math.sin(a), 0, 0] for a in angles], dtype=np.float32)
    store.upsert(chunks, vectors, sparse=encoder.documents([c.passage for c in chunks]))
    return np.array([1, 0, 0, 0], dtype=np.float32)


@pytest.mark.parametrize("fusion", [Fusion("dbsf"), Fusion("rrf", 2), Fusion("rrf", 10, 1, 0.5)])
def test_a_translation_takes_its_bm25_share_from_the_dense_list(store: Store, fusion: Fusion):
    encoder = QdrantBm25(PARAMS, "english")
    query = _languages_corpus(store, encoder)
    lexical = encoder.query("granite basalt").vector

    def ranked(weight: float, languages: list[str]) -> list[str]:
        hits = store.search(
            query,
            9,
            sparse=lexical,
            fusion=replace(fusion, other_languages=weight),
            languages=languages,
        )
        return [h.chunk.doc_id for h in hits]

    assert store.search(query, 9)[0].chunk.doc_id == "de"
    qdrant = ranked(0.0, ["en"])
    assert qdrant == [h.chunk.doc_id for h in store.search(query, 9, sparse=lexical, fusion=fusion)]
    assert qdrant.index("de") > 0  # BM25 cannot read it, and Qdrant's fusion counts that against it
    # The more of the dense list's judgement it takes, the higher it ranks: first when judged
    # by the dense list alone.
    ranks = [ranked(weight, ["en"]).index("de") for weight in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert ranks == sorted(ranks, reverse=True) and ranks[-1] == 0
    # The English passages keep their order among themselves.
    for weight in (0.5, 1.0):
        assert [d for d in ranked(weight, ["en"]) if d != "de"] == [d for d in qdrant if d != "de"]
    # With the German passage in the query's languages, Qdrant's order.
    assert ranked(1.0, ["en", "de"]) == qdrant


@pytest.mark.parametrize("fusion", [Fusion("dbsf"), Fusion("rrf", 2), Fusion("rrf", 60, 2, 1)])
def test_one_language_fuses_exactly_as_qdrant(store: Store, fusion: Fusion):
    """With every passage in the query's language, the language-aware fusion is Qdrant's own:
    the same passages, order and scores."""
    encoder = QdrantBm25(PARAMS, "english")
    store.ensure_collection(4)
    texts = [" ".join(["granite"] * (i % 3 + 1) + ["basalt"] * (i % 4)) for i in range(12)]
    chunks = [
        Chunk(doc_id=f"d{i}", chunk_index=0, text=t, metadata={"lang": "en"})
        for i, t in enumerate(texts)
    ]
    vectors = np.random.default_rng(3).normal(size=(12, 4)).astype(np.float32)
    store.upsert(chunks, vectors, sparse=encoder.documents(texts))
    query = np.random.default_rng(9).normal(size=4).astype(np.float32)
    lexical = encoder.query("granite basalt").vector
    qdrant = store.search(query, 6, sparse=lexical, fusion=fusion)
    aware = store.search(query, 6, sparse=lexical, fusion=fusion, languages=["en"])
    assert [h.chunk.doc_id for h in aware] == [h.chunk.doc_id for h in qdrant]
    assert [h.retrieval_score for h in aware] == pytest.approx(
        [h.retrieval_score for h in qdrant], rel=1e-5
    )
