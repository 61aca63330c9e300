"""Loading BEIR-layout collections: corpus.jsonl(.gz), queries.jsonl, qrels/<split>.tsv."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from ragrank.documents import Document, open_text, read_jsonl_documents
from ragrank.errors import DocumentError

if TYPE_CHECKING:
    from pathlib import Path

#: query id → document id → graded relevance (0 kept: judged non-relevant).
Qrels = Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class BeirDataset:
    name: str
    corpus: Mapping[str, Document]
    queries: Mapping[str, str]
    qrels: Qrels
    #: SHA-256 of each file read, by file name: reports and the embedding cache key use them.
    checksums: Mapping[str, str] = field(default_factory=dict)
    #: Each query's language, where the folder's name is a language code (XQuAD-R's `de`).
    query_languages: Mapping[str, str] = field(default_factory=dict)
    #: The collections a merged one was made of, in corpus order.
    parts: tuple[BeirDataset, ...] = ()
    #: Each query's `metadata` object from queries.jsonl (scalar fields, as strings), which a
    #: held-out split can group queries by (XQuAD-R's `paragraph`).
    query_metadata: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def judged_queries(self) -> dict[str, str]:
        """The queries that have relevance labels in this split, in file order."""
        return {qid: text for qid, text in self.queries.items() if qid in self.qrels}


def load_beir(root: Path, split: str = "test") -> BeirDataset:
    corpus_path = next(
        (root / name for name in ("corpus.jsonl", "corpus.jsonl.gz") if (root / name).exists()),
        None,
    )
    if corpus_path is None:
        raise DocumentError(f"{root}: no corpus.jsonl or corpus.jsonl.gz")
    corpus = {doc.doc_id: doc for doc in read_jsonl_documents(corpus_path)}
    qrels_path = root / "qrels" / f"{split}.tsv"
    metadata: dict[str, dict[str, str]] = {}
    queries = load_queries(root / "queries.jsonl", metadata)
    language = _folder_language(root.name)
    return BeirDataset(
        name=root.name,
        corpus=MappingProxyType(corpus),
        queries=MappingProxyType(queries),
        query_languages=MappingProxyType(dict.fromkeys(queries, language) if language else {}),
        qrels=MappingProxyType(load_qrels(qrels_path)),
        query_metadata=MappingProxyType(metadata),
        checksums=MappingProxyType(
            {
                path.relative_to(root).as_posix(): file_sha256(path)
                for path in (corpus_path, root / "queries.jsonl", qrels_path)
            }
        ),
    )


def _folder_language(name: str) -> str | None:
    """The language a folder's name is the ISO 639-1 code of (`de`, `zh`), if it is one."""
    from ragrank.language import known_language

    if len(name) not in (2, 3) or not name.isalpha():
        return None
    return known_language(name)


def merge_beir(parts: Sequence[BeirDataset], relevance: str = "same") -> BeirDataset:
    """One collection of several: every id gets its part's name as a prefix (`de/…`), so ids
    stay unique, and queries keep their part's language.

    `same`: a query's answers are its own part's. `any`: a query's answers are those of every
    part that holds the same query id, the parallel translations of one question set, so a
    German question is answered by the English passage too.
    """
    if relevance not in ("same", "any"):
        raise ValueError(f"relevance must be same or any, not {relevance!r}")
    names = [part.name for part in parts]
    if len(set(names)) != len(names):
        raise DocumentError(f"merged folders need distinct names, got {', '.join(names)}")
    corpus: dict[str, Document] = {}
    queries: dict[str, str] = {}
    languages: dict[str, str] = {}
    metadata: dict[str, Mapping[str, str]] = {}
    qrels: dict[str, dict[str, int]] = {}
    for part in parts:
        for doc_id, document in part.corpus.items():
            corpus[f"{part.name}/{doc_id}"] = replace(document, doc_id=f"{part.name}/{doc_id}")
        for qid, text in part.queries.items():
            queries[f"{part.name}/{qid}"] = text
            if qid in part.query_languages:
                languages[f"{part.name}/{qid}"] = part.query_languages[qid]
            if qid in part.query_metadata:
                metadata[f"{part.name}/{qid}"] = part.query_metadata[qid]
        for qid in part.qrels:
            sources = [p for p in parts if qid in p.qrels] if relevance == "any" else [part]
            qrels[f"{part.name}/{qid}"] = {
                f"{source.name}/{doc_id}": grade
                for source in sources
                for doc_id, grade in source.qrels[qid].items()
            }
    checksums = {
        f"{part.name}/{file}": digest for part in parts for file, digest in part.checksums.items()
    }
    return BeirDataset(
        name=f"merged-{relevance}",
        corpus=MappingProxyType(corpus),
        queries=MappingProxyType(queries),
        qrels=MappingProxyType(qrels),
        checksums=MappingProxyType(checksums),
        query_languages=MappingProxyType(languages),
        parts=tuple(parts),
        query_metadata=MappingProxyType(metadata),
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_queries(path: Path, metadata: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
    """Query id → text; each query's scalar metadata fields go into `metadata` when given."""
    queries: dict[str, str] = {}
    with open_text(path) as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if "_id" not in record or not isinstance(record.get("text"), str):
                raise DocumentError(f"{path}:{line_number}: a query needs '_id' and 'text'")
            queries[str(record["_id"])] = record["text"]
            fields = record.get("metadata")
            if metadata is not None and isinstance(fields, dict):
                metadata[str(record["_id"])] = {
                    str(key): str(value)
                    for key, value in fields.items()
                    if isinstance(value, str | int | float | bool)
                }
    return queries


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    """Read a qrels TSV with a header row; ids stay strings, relevance 0 is kept."""
    if not path.exists():
        raise DocumentError(f"{path} does not exist")
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t")
        next(rows, None)
        for line_number, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) < 3:
                raise DocumentError(f"{path}:{line_number}: expected query-id, corpus-id, score")
            qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    return qrels
