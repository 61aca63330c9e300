"""Where documents come from: JSONL files (BEIR corpora included) and folders of text files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ragrank.documents import Document, read_jsonl_documents
from ragrank.errors import DocumentError

TEXT_SUFFIXES = (".txt", ".md")
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
    """Each text file is a document whose id is its path relative to `root`."""
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DocumentError(f"{path}: not UTF-8 text") from None
        relative = path.relative_to(root).as_posix()
        yield Document(
            doc_id=relative,
            text=text,
            title=_title(text, path),
            metadata={"source": relative},
        )


def _title(text: str, path: Path) -> str:
    """The first Markdown heading, else the file name without its suffix."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            return stripped.lstrip("#").strip()
        if stripped:
            break
    return path.stem
