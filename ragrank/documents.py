"""The domain records (documents, chunks, retrieved candidates) and the JSONL reader both
indexing and evaluation use for BEIR-style corpora."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from ragrank.errors import DocumentError
from ragrank.ids import doc_id_problem

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from pathlib import Path

MetadataValue = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class Document:
    """A source document before chunking."""

    doc_id: str
    text: str
    title: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def passage(self) -> str:
        """What the models see of a whole document (the evaluation reads documents whole)."""
        return passage_text(self.title, self.text)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a document: the unit that is embedded, stored and reranked."""

    doc_id: str
    chunk_index: int
    text: str
    title: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: Character offsets of `text` inside the document's text.
    start: int = 0
    end: int = 0

    @property
    def passage(self) -> str:
        """What the models see of this chunk."""
        return passage_text(self.title, self.text)


def passage_text(title: str, text: str) -> str:
    """What the embedder and the reranker read: the title, when there is one, then the text."""
    return f"{title} {text}" if title else text


@dataclass(frozen=True, slots=True)
class Candidate:
    """A chunk retrieved from the store, with its first-stage score: cosine similarity,
    BM25, or the fused score of both."""

    chunk: Chunk
    retrieval_score: float


def open_text(path: Path) -> IO[str]:
    """Open a text file, transparently gunzipping `*.gz`."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def read_jsonl_documents(path: Path) -> Iterator[Document]:
    """Read `{"id"|"_id", "text", "title"?, "metadata"?}` lines (BEIR's corpus.jsonl included)."""
    with open_text(path) as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DocumentError(f"{where}: not valid JSON ({exc.msg})") from None
            yield document_from_record(record, where=where)


def document_from_record(record: object, *, where: str) -> Document:
    """Validate one JSON record into a `Document`, naming `where` in any error."""
    if not isinstance(record, dict):
        raise DocumentError(f"{where}: expected a JSON object")
    doc_id = record.get("id", record.get("_id"))
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id:
        raise DocumentError(f"{where}: needs a non-empty string 'id' or '_id'")
    problem = doc_id_problem(doc_id)
    if problem:
        raise DocumentError(f"{where}: {problem}")
    text = record.get("text")
    if not isinstance(text, str):
        raise DocumentError(f"{where}: document {doc_id!r} needs a string 'text'")
    title = record.get("title") or ""
    if not isinstance(title, str):
        raise DocumentError(f"{where}: document {doc_id!r} has a non-string 'title'")
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise DocumentError(f"{where}: document {doc_id!r} has a non-object 'metadata'")
    return Document(doc_id=doc_id, text=text, title=title, metadata=metadata)
