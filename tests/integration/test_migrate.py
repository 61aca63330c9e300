"""A folder written by the earlier embedded engine (qdrant-client's local mode) is recognised,
and `ragrank store migrate` moves it into Qdrant Edge without re-embedding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
from qdrant_client import QdrantClient

from cli import main
from ragrank.documents import Chunk
from ragrank.errors import StoreError
from ragrank.settings import Settings
from ragrank.sparse import sparse_encoder
from ragrank.store import DocumentStamp, ServerStore, open_store, sparse_stamp

if TYPE_CHECKING:
    from pathlib import Path


def _old_folder(folder: Path) -> np.ndarray:
    """Two collections in the earlier engine's format, written through the same payload code."""
    vectors = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    old = ServerStore(QdrantClient(path=str(folder)), "ragrank")
    old.ensure_collection(8)
    chunks = [
        Chunk(doc_id=f"d{i // 3}", chunk_index=i % 3, text=f"t{i}", metadata={"lang": "de"})
        for i in range(300)
    ]
    stamps = {f"d{i}": DocumentStamp(f"h{i}", 3, origin="/docs") for i in range(100)}
    old.upsert(chunks, vectors, stamps)
    old.close()
    demo = ServerStore(QdrantClient(path=str(folder)), "ragrank-demo")
    demo.ensure_collection(8)
    demo.upsert(chunks[:5], vectors[:5])
    demo.close()
    return vectors


def test_an_old_folder_is_recognised_and_migrated_without_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    folder = tmp_path / "qdrant"
    vectors = _old_folder(folder)
    settings = Settings(qdrant_path=folder, collection="ragrank")

    with pytest.raises(StoreError, match="ragrank store migrate"):
        open_store(settings)

    for _ in range(2):  # a rerun rewrites the same points
        code = main(["store", "migrate", "--qdrant-path", str(folder), "--no-progress"])
        assert code == 0
    out = capsys.readouterr().out
    assert "ragrank: 300 points (8-d) copied" in out and "ragrank-demo: 5 points" in out

    store = open_store(settings)
    try:
        assert store.count() == 300
        hit = store.search(vectors[42], 1, {"lang": "de"})[0]
        assert (hit.chunk.doc_id, hit.chunk.chunk_index, hit.chunk.text) == ("d14", 0, "t42")
        assert hit.retrieval_score == pytest.approx(1.0, abs=1e-5)
        # The migration added the BM25 vectors, from the stored text, and stamped them.
        encoder = sparse_encoder(settings)
        stored = store.stored_documents(["d14"])["d14"]
        assert stored.holds_version("h14", "/docs", sparse_stamp(encoder))
        assert encoder is not None
        lexical = store.search(None, 3, sparse=encoder.query("t42").vector)
        assert [h.chunk.text for h in lexical][:1] == ["t42"]
        assert store.documents_from("/docs") == {f"d{i}" for i in range(100)}
    finally:
        store.close()
    demo = open_store(settings.replace(collection="ragrank-demo"))
    try:
        assert demo.count() == 5
    finally:
        demo.close()


def test_migrating_a_folder_with_nothing_to_migrate_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    code = main(["store", "migrate", "--qdrant-path", str(tmp_path / "empty"), "--no-progress"])
    assert code == 2
    assert "holds no collection of the earlier embedded engine" in capsys.readouterr().err
