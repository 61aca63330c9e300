"""How waiting items become batches: the cost rule, the cut of a run of items under both
limits, and the policies that pick the next batch. Pure functions over token lengths, so the
server's engine and the eval's offline reranking share one rule and tests read it directly.

`continuous` (the default) forms one batch at a time, when the device is about to need it, from
the oldest waiting work (text-embeddings-inference's queue and vLLM's first-come scheduler work
the same way):
- packed batches cost their real tokens, so the next batch is simply the oldest items that fit:
  a request stays in as few batches as its size allows;
- padded batches cost count x longest, so the oldest items of a look-ahead
  (`LOOKAHEAD_BATCHES` batches' worth) are sorted by length, and the next batch is the run of
  the oldest item's neighbours in length that fills the limits with the least padding. The
  oldest item always runs, so no request waits behind more than that look-ahead of later work,
  and requests finish oldest first, batch by batch.

The window policies (`window`, `arrival`, `request`) take up to `WINDOW_BATCHES` batches' worth
of work at once and run all of it before looking again: the least padding, but every request of
a window finishes with its last batch. They are the baselines of the benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ragrank.settings import Batching

#: Padded continuous batching sorts this many batches' worth of the oldest items by length: in
#: a simulation of 1,024 pairs of SciFact-like lengths in batches of 16, 4 batches' worth left
#: 9 % of the tokens as padding and 32 left 1.6 % (a window of everything, 0.9 %); on a CPU,
#: where padding is the cost, that is throughput.
LOOKAHEAD_BATCHES = 32
#: A window policy sorts up to this many batches' worth at once (on SciFact pairs, 6 % of the
#: tokens are padding with 8 batches, 2.4 % with 32; `ragrank bench`).
WINDOW_BATCHES = 32


@dataclass
class EngineLimits:
    """One model's batch limits and queueing policy."""

    max_batch_size: int
    max_batch_tokens: int
    max_wait_ms: float = 5.0
    max_queue_items: int = 4096
    timeout_s: float = 60.0
    policy: Batching = "continuous"
    #: The model packs batches without padding: the budget counts real tokens.
    packed: bool = False
    #: The most tokens a bulk (indexing) batch costs, by the same rule: what a request that
    #: arrives behind indexing waits for at most. 0: the whole budget.
    max_bulk_tokens: int = 0

    def bulk(self) -> EngineLimits:
        """The limits bulk batches are cut by."""
        return replace(self, max_batch_tokens=self.max_bulk_tokens or self.max_batch_tokens)


def batch_cost(count: int, longest: int, total: int, *, packed: bool) -> int:
    """Tokens a batch costs on the device: its real ones when packed, else count x longest."""
    return total if packed else count * longest


def cut(lengths: Sequence[int], size: int, tokens: int, *, packed: bool) -> list[slice]:
    """Consecutive runs of `lengths`, in the order given, each within `size` items and `tokens`
    (by `batch_cost`); an item over the budget alone still gets a batch of its own."""
    runs: list[slice] = []
    start = longest = total = 0
    for index, length in enumerate(lengths):
        count = index - start + 1
        cost = batch_cost(count, max(longest, length), total + length, packed=packed)
        if count > 1 and (count > size or cost > tokens):
            runs.append(slice(start, index))
            start, longest, total = index, 0, 0
        longest = max(longest, length)
        total += length
    if start < len(lengths):
        runs.append(slice(start, len(lengths)))
    return runs


def longest_first(lengths: Sequence[int]) -> list[int]:
    """Indices of `lengths`, longest first; ties keep their order."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def lookahead(limits: EngineLimits) -> int:
    """How many of the oldest waiting items `next_batch` reads: a batch's worth when packed
    (the oldest that fit), `LOOKAHEAD_BATCHES` batches' worth when padded."""
    return limits.max_batch_size * (1 if limits.packed else LOOKAHEAD_BATCHES)


def next_batch(waiting: Sequence[int], limits: EngineLimits) -> list[int]:
    """The continuous policy: which of the oldest waiting items (their lengths, oldest first)
    form the next batch, as indices into `waiting`, longest first."""
    if not waiting:
        return []
    if limits.packed:
        first = cut(waiting, limits.max_batch_size, limits.max_batch_tokens, packed=True)[0]
        return longest_first(waiting[first])
    pool = waiting[: lookahead(limits)]
    order = longest_first(pool)
    start, count = _around(
        [pool[i] for i in order], order.index(0), limits.max_batch_size, limits.max_batch_tokens
    )
    return order[start : start + count]


def _around(lengths: Sequence[int], head: int, size: int, tokens: int) -> tuple[int, int]:
    """(start, count) of the run of `lengths` (longest first) that holds `head`, is as full
    as both limits allow, and among those pads least: a batch as large as a window's, of the
    oldest item's neighbours in length."""
    best: tuple[int, int, int] | None = None  # (-count, padding, start)
    for start in range(max(0, head - size + 1), head + 1):
        count = min(size, len(lengths) - start, max(1, tokens // lengths[start]))
        if start + count <= head:
            continue
        run = lengths[start : start + count]
        candidate = (-count, count * run[0] - sum(run), start)
        if best is None or candidate < best:
            best = candidate
    assert best is not None  # start = head always qualifies
    return best[2], -best[0]


def window_batches(waiting: Sequence[int], limits: EngineLimits) -> list[list[int]]:
    """A window policy: all of `waiting` (lengths of one window's items, oldest first) cut into
    batches, longest first (or in arrival order), as indices into `waiting`."""
    order = list(range(len(waiting)))
    if limits.policy != "arrival":
        order = longest_first(waiting)
    runs = cut(
        [waiting[i] for i in order],
        limits.max_batch_size,
        limits.max_batch_tokens,
        packed=limits.packed,
    )
    return [order[run] for run in runs]
