from __future__ import annotations

import gzip
import json
import os
from typing import TYPE_CHECKING

import pytest

from indexing.sources import html_text, read_documents, read_file
from ragrank.errors import DocumentError

if TYPE_CHECKING:
    from pathlib import Path


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
    os.utime(tmp_path / "a.txt", (0, 86_400))
    assert read_file(tmp_path / "a.txt", tmp_path).metadata["modified"] == (
        "1970-01-02T00:00:00+00:00"
    )


def test_html_is_reduced_to_its_visible_text_by_a_parser(tmp_path: Path):
    page = """<!doctype html><html><head><title>The  Rhine</title>
    <style>p { color: red }</style><script>if (a < b) { alert("x") }</script></head>
    <body><nav>Menu</nav><h1>River</h1><p>Flows &amp; meets the <b>North Sea</b>.</p>
    <!-- a comment --><div>Second<br>line</div><p>A &lt;tag&gt; in text.</p></body></html>"""
    (tmp_path / "rhine.html").write_text(page, encoding="utf-8")
    (document,) = read_documents(tmp_path)
    assert document.doc_id == "rhine.html"
    assert document.title == "The Rhine"
    assert document.text == (
        "Menu\n\nRiver\n\nFlows & meets the North Sea.\n\nSecond\n\nline\n\nA <tag> in text."
    )
    assert "alert" not in document.text and "color" not in document.text


def test_html_without_a_title_falls_back_to_h1_then_the_file_name():
    assert html_text("<h1>Big  title</h1><p>x</p>")[0] == "Big title"
    assert html_text("<p>x</p>") == ("", "x")


def test_unknown_paths_are_refused(tmp_path: Path):
    with pytest.raises(DocumentError, match="does not exist"):
        read_documents(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(DocumentError, match="expected a folder"):
        read_documents(tmp_path / "x.csv")
