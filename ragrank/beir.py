"""Loading BEIR-layout collections: corpus.jsonl(.gz), queries.jsonl, qrels/<split>.tsv."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    return BeirDataset(
        name=root.name,
        corpus=MappingProxyType(corpus),
        queries=MappingProxyType(load_queries(root / "queries.jsonl")),
        qrels=MappingProxyType(load_qrels(qrels_path)),
        checksums=MappingProxyType(
            {
                path.relative_to(root).as_posix(): file_sha256(path)
                for path in (corpus_path, root / "queries.jsonl", qrels_path)
            }
        ),
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    with open_text(path) as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if "_id" not in record or not isinstance(record.get("text"), str):
                raise DocumentError(f"{path}:{line_number}: a query needs '_id' and 'text'")
            queries[str(record["_id"])] = record["text"]
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
