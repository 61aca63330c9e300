"""Where documents come from: JSONL files (BEIR corpora included) and folders of text, Markdown
and HTML files."""

from __future__ import annotations

from datetime import UTC, datetime
from html.parser import HTMLParser
from typing import TYPE_CHECKING

from ragrank.documents import Document, read_jsonl_documents
from ragrank.errors import DocumentError
from ragrank.ids import doc_id_problem

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md", ".html", ".htm")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


def read_documents(path: Path) -> Iterator[Document]:
    """Documents from a `.jsonl`/`.jsonl.gz` file or a folder of `.txt`/`.md` files."""
    if not path.exists():
        raise DocumentError(f"{path} does not exist")
    if path.is_dir():
        return read_folder(path)
    if path.name.endswith(JSONL_SUFFIXES):
        return read_jsonl_documents(path)
    raise DocumentError(
        f"{path}: expected a folder of {'/'.join(TEXT_SUFFIXES)} files or a "
        f"{' or '.join(JSONL_SUFFIXES)} file"
    )


def read_folder(root: Path) -> Iterator[Document]:
    """Each file is a document whose id is its path relative to `root`; its metadata holds
    that path and the file's modification time (UTC, ISO 8601)."""
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix.lower() not in TEXT_SUFFIXES:
            continue
        yield read_file(path, root)


def read_file(path: Path, root: Path) -> Document:
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DocumentError(f"{path}: not UTF-8 text") from None
    if path.suffix.lower() in (".html", ".htm"):
        title, text = html_text(raw)
        title = title or path.stem
    else:
        text, title = raw, _title(raw, path)
    relative = path.relative_to(root).as_posix()
    problem = doc_id_problem(relative)
    if problem:
        # The id of a file is its path: one the API could not address is refused here too.
        raise DocumentError(f"{path}: {problem}")
    modified = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    return Document(
        doc_id=relative, text=text, title=title, metadata={"source": relative, "modified": modified}
    )


def html_text(markup: str) -> tuple[str, str]:
    """(title, text) of an HTML page: `<title>` (else the first `<h1>`), and the visible text
    with a blank line after each block element, so chunking can cut at paragraph ends."""
    parser = _TextParser()
    parser.feed(markup)
    parser.close()
    return parser.title(), parser.text()


def _title(text: str, path: Path) -> str:
    """The first Markdown heading, else the file name without its suffix."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            return stripped.lstrip("#").strip()
        if stripped:
            break
    return path.stem


class _TextParser(HTMLParser):
    """Collects visible text; skips scripts, styles and other non-content elements."""

    SKIP = frozenset({"script", "style", "noscript", "template", "svg"})
    BLOCKS = frozenset(
        {
            "p",
            "div",
            "section",
            "article",
            "li",
            "ul",
            "ol",
            "table",
            "tr",
            "br",
            "hr",
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "pre",
            "blockquote",
            "header",
            "footer",
            "main",
            "nav",
            "aside",
            "dd",
            "dt",
            "figure",
            "figcaption",
        }
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._skipping: list[str] = []
        self._parts: list[str] = []
        self._title: list[str] = []
        self._h1: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("title", "h1"):
            self._in = tag
        if tag in self.SKIP:
            self._skipping.append(tag)
        if tag in self.BLOCKS:
            self._parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None
        if self._skipping and self._skipping[-1] == tag:
            self._skipping.pop()
        if tag in self.BLOCKS:
            self._parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._in == "title":
            self._title.append(data)
            return
        if self._in == "h1":
            self._h1.append(data)
        if not self._skipping:
            self._parts.append(data)

    def title(self) -> str:
        return " ".join("".join(self._title or self._h1).split())

    def text(self) -> str:
        paragraphs = "".join(self._parts).split("\n\n")
        cleaned = (" ".join(paragraph.split()) for paragraph in paragraphs)
        return "\n\n".join(p for p in cleaned if p)
