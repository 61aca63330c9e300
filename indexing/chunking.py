"""Token-aware chunking with the embedder's own tokenizer, cutting at paragraph or sentence ends."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragrank.documents import Chunk, Document

if TYPE_CHECKING:
    from collections.abc import Callable

TokenSpans = list[tuple[int, int]]

_PARAGRAPH_END = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"[.!?。！？]+[\"')\]]*\s")


@dataclass(frozen=True)
class Chunker:
    """Splits documents into chunks of at most `max_tokens` tokens (title included), with
    `overlap` tokens shared between neighbours."""

    token_spans: Callable[[str], TokenSpans]
    max_tokens: int
    overlap: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or not 0 <= self.overlap < self.max_tokens:
            raise ValueError("need max_tokens >= 1 and 0 <= overlap < max_tokens")

    def chunk(self, document: Document) -> list[Chunk]:
        text = document.text
        spans = self.token_spans(text)
        if not spans:
            return []
        # The title is embedded with every chunk, so it takes its share of the budget (but never
        # more than half of it: a chunk keeps room for its own text).
        title_tokens = len(self.token_spans(document.title)) if document.title else 0
        budget = max(self.max_tokens - title_tokens, self.max_tokens // 2, 1)
        overlap = min(self.overlap, budget - 1)
        cuts = _boundaries(text)
        starts = [span[0] for span in spans]
        chunks: list[Chunk] = []
        start = 0
        while start < len(spans):
            end = min(start + budget, len(spans))
            if end < len(spans):
                end = _best_cut(starts, cuts, start, end)
            begin_char, end_char = spans[start][0], spans[end - 1][1]
            # Some tokenizers (SentencePiece) count the space before a word into its token.
            while begin_char < end_char and text[begin_char].isspace():
                begin_char += 1
            chunks.append(
                Chunk(
                    doc_id=document.doc_id,
                    chunk_index=len(chunks),
                    text=text[begin_char:end_char],
                    title=document.title,
                    metadata=document.metadata,
                    start=begin_char,
                    end=end_char,
                )
            )
            if end == len(spans):
                break
            start = max(end - overlap, start + 1)
        return chunks


def _boundaries(text: str) -> tuple[list[int], list[int]]:
    """Character positions where a paragraph or a sentence ends."""
    return (
        [m.end() for m in _PARAGRAPH_END.finditer(text)],
        [m.end() for m in _SENTENCE_END.finditer(text)],
    )


def _best_cut(starts: list[int], cuts: tuple[list[int], list[int]], start: int, end: int) -> int:
    """The token index to end a chunk at (exclusive): the last paragraph end, else the last
    sentence end, in the second half of the window; the full window when neither is there."""
    floor = start + max(1, (end - start) // 2)
    for positions in cuts:
        low = bisect.bisect_right(positions, starts[floor - 1])
        high = bisect.bisect_right(positions, starts[end])
        if low < high:
            # The first token starting at or after the boundary begins the next chunk.
            return bisect.bisect_left(starts, positions[high - 1])
    return end
