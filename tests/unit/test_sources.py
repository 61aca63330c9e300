from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from indexing.sources import read_documents
from ragrank.errors import DocumentError


def _write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_jsonl_accepts_id_or__id_title_and_metadata(tmp_path: Path):
    path = _write_jsonl(
        tmp_path / "docs.jsonl",
        [
            {"id": "a", "text": "alpha", "title": "A", "metadata": {"lang": "en"}},
            {"_id": "b", "text": "beta"},
            {"_id": 7, "text": "numeric ids become strings"},
        ],
    )
    docs = list(read_documents(path))
    assert [(d.doc_id, d.title, dict(d.metadata)) for d in docs] == [
        ("a", "A", {"lang": "en"}),
        ("b", "", {}),
        ("7", "", {}),
    ]


def test_beir_corpus_gz_is_read(tmp_path: Path):
    path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"_id": "d1", "title": "T", "text": "x", "metadata": {}}) + "\n\n")
    assert [d.doc_id for d in read_documents(path)] == ["d1"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"text": "no id"}', r"docs.jsonl:2: needs a non-empty string 'id'"),
        ('{"id": "x"}', r"docs.jsonl:2: document 'x' needs a string 'text'"),
        ('{"id": "x", "text": "t", "metadata": [1]}', r"non-object 'metadata'"),
        ("not json", r"docs.jsonl:2: not valid JSON"),
        ("[1, 2]", r"docs.jsonl:2: expected a JSON object"),
    ],
)
def test_bad_lines_are_reported_with_file_and_line(tmp_path: Path, line: str, message: str):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "ok", "text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DocumentError, match=message):
        list(read_documents(path))


def test_folder_reads_txt_and_md_with_relative_ids_and_titles(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("Plain text.", encoding="utf-8")
    (tmp_path / "sub" / "b.md").write_text("# Heading B\n\nBody.", encoding="utf-8")
    (tmp_path / "ignored.pdf").write_bytes(b"%PDF")
    docs = {d.doc_id: d for d in read_documents(tmp_path)}
    assert set(docs) == {"a.txt", "sub/b.md"}
    assert docs["sub/b.md"].title == "Heading B"
    assert docs["a.txt"].title == "a"
    assert docs["sub/b.md"].metadata["source"] == "sub/b.md"


def test_unknown_paths_are_refused(tmp_path: Path):
    with pytest.raises(DocumentError, match="does not exist"):
        read_documents(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(DocumentError, match="expected a folder"):
        read_documents(tmp_path / "x.csv")
