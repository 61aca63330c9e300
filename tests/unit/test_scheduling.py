"""The batch cost rule and the policies that pick the next batch, read directly: the server's
engine and the eval's offline reranking both cut batches with these."""

from __future__ import annotations

import random

import pytest

from ragrank.engine import EngineLimits, cut, longest_first
from ragrank.engine.scheduling import LOOKAHEAD_BATCHES, next_batch, window_batches


def test_cut_holds_both_limits_in_the_order_given():
    lengths = [50, 30, 20, 10, 10, 7, 5, 3]
    runs = cut(lengths, size=3, tokens=60, packed=False)
    assert [i for run in runs for i in range(run.start, run.stop)] == list(range(len(lengths)))
    for run in runs:
        batch = lengths[run]
        assert len(batch) <= 3
        assert max(batch) * len(batch) <= 60 or len(batch) == 1
    packed = cut(lengths[::-1], size=8, tokens=60, packed=True)
    assert all(sum(lengths[::-1][run]) <= 60 or run.stop - run.start == 1 for run in packed)
    # Packed, the budget counts real tokens: 3+5+7+10+10+20 = 55 fit where padding cost 120.
    assert packed[0] == slice(0, 6)


def test_an_item_over_the_budget_gets_a_batch_of_its_own():
    assert cut([500, 10, 10], size=8, tokens=100, packed=False) == [slice(0, 1), slice(1, 3)]


def test_packed_continuous_takes_the_oldest_items_that_fit():
    limits = EngineLimits(max_batch_size=8, max_batch_tokens=100, packed=True)
    waiting = [40, 10, 30, 50, 5]
    assert next_batch(waiting, limits) == [0, 2, 1]  # 80 tokens; the 50 would pass 100
    assert next_batch([], limits) == []


@pytest.mark.parametrize("seed", range(20))
def test_padded_continuous_always_runs_the_oldest_item_within_the_lookahead(seed: int):
    rng = random.Random(seed)
    limits = EngineLimits(max_batch_size=4, max_batch_tokens=400, packed=False)
    waiting = [rng.randint(1, 120) for _ in range(rng.randint(1, 40))]
    chosen = next_batch(waiting, limits)
    assert 0 in chosen
    assert max(chosen) < limits.max_batch_size * LOOKAHEAD_BATCHES
    assert len(chosen) <= 4
    batch = [waiting[i] for i in chosen]
    assert batch == sorted(batch, reverse=True)
    assert len(batch) == 1 or len(batch) * max(batch) <= 400


def test_padded_continuous_groups_the_oldest_item_with_others_of_its_length():
    limits = EngineLimits(max_batch_size=2, max_batch_tokens=10_000, packed=False)
    # The oldest item is short: it runs with the other short one, not with the long ones.
    assert sorted(next_batch([3, 90, 80, 4], limits)) == [0, 3]


def test_window_policies_cut_everything_longest_first_or_in_arrival_order():
    waiting = [1, 9, 8, 2, 3, 7]
    limits = EngineLimits(max_batch_size=2, max_batch_tokens=10_000, policy="window")
    assert [[waiting[i] for i in b] for b in window_batches(waiting, limits)] == [
        [9, 8],
        [7, 3],
        [2, 1],
    ]
    limits.policy = "arrival"
    assert window_batches(waiting, limits) == [[0, 1], [2, 3], [4, 5]]


def test_longest_first_keeps_ties_in_order():
    assert longest_first([2, 5, 2, 5]) == [1, 3, 0, 2]
