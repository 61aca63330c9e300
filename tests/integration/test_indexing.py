from __future__ import annotations

import json
from typing import TYPE_CHECKING

from cli import main
from indexing import Indexer
from ragrank import SAMPLE_DATASET
from ragrank.backends.models import SentenceTransformerEmbedder
from ragrank.beir import load_beir
from ragrank.store import open_store

if TYPE_CHECKING:
    from pathlib import Path

    from ragrank.settings import Settings


def test_indexing_the_sample_twice_leaves_the_point_count_unchanged(settings: Settings):
    embedder = SentenceTransformerEmbedder.from_settings(settings)
    store = open_store(settings)
    try:
        indexer = Indexer.from_settings(settings, embedder, store)
        documents = list(load_beir(SAMPLE_DATASET).corpus.values())
        first = indexer.index(documents, progress=False)
        assert first.documents == len(documents) == 124
        assert first.chunks >= first.documents
        assert store.count() == first.chunks
        assert first.new == 124
        second = indexer.index(documents, progress=False)
        assert (second.unchanged, second.new, second.updated, second.chunks) == (124, 0, 0, 0)
        assert store.count() == first.chunks
    finally:
        store.close()


def test_long_documents_are_split_into_chunks_within_the_budget(settings: Settings):
    embedder = SentenceTransformerEmbedder.from_settings(settings)
    store = open_store(settings)
    try:
        indexer = Indexer.from_settings(settings, embedder, store)
        text = " ".join(f"Sentence number {i} talks about rivers." for i in range(100))
        from ragrank.documents import Document

        document = Document(doc_id="long", text=text, title="Rivers of the world")
        summary = indexer.index([document], progress=False)
        assert summary.chunks > 1
        hits = store.search(embedder.embed_queries(["rivers"])[0], 100, {"doc_id": "long"})
        assert len(hits) == summary.chunks
        prefix_tokens = len(embedder.token_spans(embedder.passage_prefix))
        for hit in hits:
            passage_tokens = len(embedder.token_spans(hit.chunk.passage))
            assert passage_tokens + prefix_tokens <= settings.chunk_tokens
            assert text[hit.chunk.start : hit.chunk.end] == hit.chunk.text
    finally:
        store.close()


def test_ragrank_index_cli_reports_a_summary(tmp_path: Path, settings: Settings, capsys):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(
        "\n".join(json.dumps({"id": f"d{i}", "text": f"document {i}"}) for i in range(5)),
        encoding="utf-8",
    )
    argv = [
        "index",
        str(corpus),
        "--embed-model",
        settings.embed_model,
        "--device",
        "cpu",
        "--qdrant-path",
        str(settings.qdrant_path),
        "--collection",
        "cli",
        "--no-progress",
    ]
    assert main(argv) == 0
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "5 documents: 5 new, 0 updated, 0 unchanged, 0 deleted; 5 chunks" in out
    assert "5 documents: 0 new, 0 updated, 5 unchanged, 0 deleted; 0 chunks" in out
    store = open_store(settings.replace(collection="cli"))
    try:
        assert store.count() == 5
    finally:
        store.close()
