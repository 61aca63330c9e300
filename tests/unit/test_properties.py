"""Property tests (hypothesis): chunking loses no token and keeps every limit, whatever the text;
the batching engine hands every request exactly its own results, in order, whatever the mix of
requests, limits and policy."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from hypothesis import given, settings
from hypothesis import strategies as st

from indexing.chunking import Chunker
from ragrank.documents import Document
from ragrank.engine import BatchEngine, EngineLimits, batch_cost

if TYPE_CHECKING:
    from collections.abc import Sequence

WORD = re.compile(r"\S+")


def word_spans(text: str) -> list[tuple[int, int]]:
    """A tokenizer whose tokens are the text's words."""
    return [match.span() for match in WORD.finditer(text)]


texts = st.lists(
    st.one_of(
        st.text(alphabet="abcdefghij", min_size=1, max_size=8),
        st.sampled_from([". ", "! ", "? ", "\n\n", " ", "  ", "\t", "。", "，"]),
    ),
    max_size=120,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    text=texts,
    title=st.sampled_from(["", "A title", "a much longer title of eight words here"]),
    max_tokens=st.integers(1, 24),
    data=st.data(),
)
def test_chunks_cover_every_token_within_the_budget(
    text: str, title: str, max_tokens: int, data: st.DataObject
):
    overlap = data.draw(st.integers(0, max_tokens - 1))
    chunker = Chunker(word_spans, max_tokens, overlap)
    chunks = chunker.chunk(Document(doc_id="d", text=text, title=title))
    spans = word_spans(text)
    if not spans:
        assert chunks == []
        return
    title_tokens = len(word_spans(title))
    budget = max(max_tokens - title_tokens, max_tokens // 2, 1)
    covered: set[int] = set()
    previous_start = -1
    for index, chunk in enumerate(chunks):
        assert chunk.chunk_index == index and chunk.doc_id == "d" and chunk.title == title
        assert chunk.text == text[chunk.start : chunk.end]
        assert chunk.text and not chunk.text[0].isspace()
        assert chunk.start > previous_start  # every chunk moves forward
        previous_start = chunk.start
        inside = [i for i, (s, e) in enumerate(spans) if s >= chunk.start and e <= chunk.end]
        assert 1 <= len(inside) <= budget
        covered.update(inside)
    assert covered == set(range(len(spans)))  # no token lost


class Doubler:
    """A model whose items are token lengths and whose output is twice the item."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def lengths(self, items: Sequence[int]) -> list[int]:
        return list(items)

    def run(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        return [2 * item for item in items]


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.lists(st.integers(1, 64), min_size=1, max_size=12), max_size=12),
    max_batch_size=st.integers(1, 16),
    max_batch_tokens=st.integers(1, 256),
    policy=st.sampled_from(["continuous", "window", "arrival", "request"]),
    packed=st.booleans(),
)
def test_every_request_gets_its_own_results_in_order(
    requests: list[list[int]], max_batch_size: int, max_batch_tokens: int, policy: str, packed: bool
):
    model = Doubler()

    async def run() -> list[list[int]]:
        engine: BatchEngine[int, list[int], int] = BatchEngine(
            "property",
            collate=list,
            run=model.run,
            length=int,
            limits=EngineLimits(
                max_batch_size=max_batch_size,
                max_batch_tokens=max_batch_tokens,
                max_wait_ms=1.0,
                policy=policy,
                packed=packed,
            ),
        )
        engine.start()
        try:
            return await asyncio.gather(*(engine.submit(items) for items in requests))
        finally:
            await engine.stop()

    results = asyncio.run(run())
    assert results == [[2 * item for item in items] for items in requests]
    assert sorted(item for batch in model.batches for item in batch) == sorted(
        item for items in requests for item in items
    )
    for batch in model.batches:
        assert 1 <= len(batch) <= max_batch_size
        cost = batch_cost(len(batch), max(batch), sum(batch), packed=packed)
        assert len(batch) == 1 or cost <= max_batch_tokens
