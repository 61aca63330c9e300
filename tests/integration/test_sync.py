"""Idempotent sync: unchanged documents are not embedded, changed ones are replaced (and their
stale tails deleted), vanished ones deleted; whatever a killed run leaves is repaired."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import numpy as np
import pytest

from indexing import Indexer
from indexing.sources import read_documents
from ragrank.backends.models import SentenceTransformerEmbedder
from ragrank.documents import Document
from ragrank.store import DocumentStamp, Store, open_store

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from ragrank.protocols import Vectors
    from ragrank.settings import Settings


class CountingEmbedder:
    """The real embedder, counting the passages it embeds."""

    def __init__(self, inner: SentenceTransformerEmbedder) -> None:
        self._inner = inner
        self.embedded: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        self.embedded.extend(texts)
        return self._inner.embed_passages(texts)


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    store = open_store(settings)
    yield store
    store.close()


@pytest.fixture
def counting(embedder: SentenceTransformerEmbedder) -> CountingEmbedder:
    return CountingEmbedder(embedder)


def _indexer(settings: Settings, embedder: object, store: Store) -> Indexer:
    return Indexer.from_settings(
        settings.replace(chunk_tokens=24, chunk_overlap=4), embedder, store
    )  # type: ignore[arg-type]


Snapshot = dict[str, tuple[object, ...]]
FIELDS = ("doc_id", "chunk", "text", "hash", "chunks")


def _snapshot(store: Store) -> Snapshot:
    """Every point: id → (doc_id, chunk, text, content hash, chunk count)."""
    points = [point for batch in store.points() for point in batch]
    return {point.id: tuple(point.payload[k] for k in FIELDS) for point in points}


def _docs(count: int, words: int = 40) -> list[Document]:
    return [
        Document(
            doc_id=f"d{i}",
            text=" ".join(f"Sentence {j} of document {i} is here." for j in range(words // 6 + 1)),
            title=f"Doc {i}",
        )
        for i in range(count)
    ]


def test_unchanged_documents_are_not_embedded_again(settings, counting, store):
    indexer = _indexer(settings, counting, store)
    documents = _docs(5)
    first = indexer.index(documents, progress=False)
    assert first.new == 5 and first.chunks == len(counting.embedded) > 5
    counting.embedded.clear()
    second = indexer.index(documents, progress=False)
    assert second.unchanged == 5 and second.chunks == 0
    assert counting.embedded == [], "an unchanged document was embedded"


def test_a_changed_document_is_replaced_and_its_stale_tail_deleted(settings, counting, store):
    indexer = _indexer(settings, counting, store)
    long = Document(doc_id="x", text=" ".join(f"Line {i} is long." for i in range(60)))
    indexer.index([long, *_docs(2)], progress=False)
    before = _snapshot(store)
    long_chunks = sum(1 for doc_id, *_ in before.values() if doc_id == "x")
    assert long_chunks > 2
    counting.embedded.clear()
    short = Document(doc_id="x", text="Now it is short.")
    summary = indexer.index([short, *_docs(2)], progress=False)
    assert (summary.updated, summary.unchanged) == (1, 2)
    assert counting.embedded == ["Now it is short."]
    after = _snapshot(store)
    assert [(c, t) for d, c, t, *_ in after.values() if d == "x"] == [(0, "Now it is short.")]
    assert len(after) == len(before) - long_chunks + 1


def test_changing_the_chunk_size_re_embeds_everything(settings, counting, store):
    documents = _docs(3)
    _indexer(settings, counting, store).index(documents, progress=False)
    wider = Indexer.from_settings(settings.replace(chunk_tokens=48), counting, store)  # type: ignore[arg-type]
    assert wider.index(documents, progress=False).updated == 3


def test_delete_missing_removes_vanished_files_of_that_folder_only(
    settings, counting, store, tmp_path: Path
):
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("a.txt", "b.md", "c.txt"):
        (folder / name).write_text(f"# {name}\n\nSome text about {name}.", encoding="utf-8")
    indexer = _indexer(settings, counting, store)
    origin = str(folder.resolve())
    indexer.index([Document(doc_id="other", text="from elsewhere")], origin="elsewhere")
    assert indexer.index(read_documents(folder), origin=origin, progress=False).new == 3
    (folder / "b.md").unlink()
    summary = indexer.index(
        read_documents(folder), origin=origin, delete_missing=True, progress=False
    )
    assert (summary.unchanged, summary.deleted, summary.deleted_ids) == (2, 1, ["b.md"])
    assert {d for d, *_ in _snapshot(store).values()} == {"a.txt", "c.txt", "other"}


def test_touching_a_file_without_changing_it_is_not_a_change(settings, counting, store, tmp_path):
    (tmp_path / "a.txt").write_text("Unchanged words.", encoding="utf-8")
    indexer = _indexer(settings, counting, store)
    indexer.index(read_documents(tmp_path), origin="t", progress=False)
    later = time.time() + 100
    os.utime(tmp_path / "a.txt", (later, later))
    assert indexer.index(read_documents(tmp_path), origin="t", progress=False).unchanged == 1


@pytest.mark.parametrize("damage", ["missing chunk", "stale tail", "old stamp"])
def test_whatever_a_killed_run_left_is_repaired(settings, counting, store, damage):
    indexer = _indexer(settings, counting, store)
    documents = _docs(4)
    indexer.index(documents, progress=False)
    clean = _snapshot(store)
    chunks = indexer.chunker.chunk(documents[1])
    if damage == "missing chunk":
        store.delete_tails({"d1": len(chunks) - 1})
    elif damage == "stale tail":
        extra = [type(chunks[0])(doc_id="d1", chunk_index=len(chunks), text="stale")]
        stamp = DocumentStamp(indexer.content_hash(documents[1]), len(chunks))
        store.upsert(extra, np.ones((1, counting.dimension), np.float32), {"d1": stamp})
    else:
        store.upsert(chunks[:1], counting.embed_passages(["x"]), {"d1": DocumentStamp("old", 3)})
    assert _snapshot(store) != clean
    summary = indexer.index(documents, progress=False)
    assert (summary.updated, summary.unchanged) == (1, 3)
    assert _snapshot(store) == clean


def test_sigkill_mid_run_then_rerun_equals_a_clean_run(settings: Settings, tmp_path: Path):
    """A real `ragrank index` process, killed with SIGKILL while it writes."""
    corpus = tmp_path / "corpus.jsonl"
    documents = 100
    lines = [
        f'{{"id": "doc{i}", "text": "{" ".join(f"Fact {j} about topic {i}." for j in range(6))}"}}'
        for i in range(documents)
    ]
    corpus.write_text("\n".join(lines), encoding="utf-8")

    def run(folder: Path, kill: bool) -> Snapshot:
        env = {
            **os.environ,
            "RAGRANK_EMBED_MODEL": settings.embed_model,
            "RAGRANK_QDRANT_PATH": str(folder),
            "RAGRANK_QDRANT_URL": "",
            "RAGRANK_DEVICE": "cpu",
            "RAGRANK_INDEX_BATCH_SIZE": "8",
            "RAGRANK_COLLECTION": settings.collection,
            "RAGRANK_CHUNK_TOKENS": "32",
            "RAGRANK_CHUNK_OVERLAP": "4",
        }
        command = [sys.executable, "-m", "cli", "index", str(corpus)]
        if kill:
            process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
            assert process.stderr is not None
            # Kill once the progress bar shows that chunks have been written.
            seen = ""
            for piece in iter(lambda: process.stderr.read(200), ""):
                seen += piece
                if "chunks=" in piece and "chunks=0," not in piece:
                    break
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            assert process.returncode == -signal.SIGKILL, seen[-2000:]
            subprocess.run(command, env=env, check=True, capture_output=True)
        store = open_store(settings.replace(qdrant_path=folder))
        try:
            if not kill:  # the clean run, in this process: same code, same settings
                same = settings.replace(chunk_tokens=32, chunk_overlap=4, index_batch_size=8)
                indexer = Indexer.from_settings(
                    same, SentenceTransformerEmbedder.from_settings(same), store
                )
                indexer.index(read_documents(corpus), origin=str(corpus.resolve()), progress=False)
            return _snapshot(store)
        finally:
            store.close()

    killed = run(tmp_path / "killed", kill=True)
    clean = run(tmp_path / "clean", kill=False)
    assert killed == clean
    assert len({doc_id for doc_id, *_ in clean.values()}) == documents
