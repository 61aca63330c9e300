"""The batching engine with plain-Python models: sharing, mapping, limits and failures."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import TYPE_CHECKING

import pytest

from ragrank.engine import BatchEngine, BatchStats, DeviceLoad, DeviceTurns, EngineLimits
from ragrank.errors import (
    BatchTooLargeError,
    EngineUnavailableError,
    ItemTooLargeError,
    ModelError,
    ModelFailedError,
    QueueFullError,
    RequestTimeoutError,
)

if TYPE_CHECKING:
    from collections.abc import Sequence


class Model:
    """Items are ints; an item's token length is its value; the output is value * 10."""

    def __init__(self, *, fits: int | None = None, gate: threading.Event | None = None) -> None:
        self.fits = fits  # a batch with more padded tokens than this runs out of memory
        self.gate = gate
        self.batches: list[list[int]] = []

    def run(self, items: Sequence[int]) -> list[int]:
        if self.gate is not None:
            self.gate.wait(10)
        if self.fits is not None and len(items) * max(items) > self.fits:
            raise BatchTooLargeError("simulated CUDA out of memory")
        self.batches.append(list(items))
        return [item * 10 for item in items]


def _engine(
    model: Model, **limits: object
) -> tuple[BatchEngine[int, list[int], int], list[BatchStats]]:
    stats: list[BatchStats] = []
    settings = {"max_batch_size": 8, "max_batch_tokens": 10_000, "max_wait_ms": 20.0, **limits}
    engine: BatchEngine[int, list[int], int] = BatchEngine(
        "test",
        collate=list,
        run=model.run,
        length=int,
        limits=EngineLimits(**settings),  # type: ignore[arg-type]
        on_batch=[stats.append],
    )
    engine.start()
    return engine, stats


async def test_concurrent_requests_share_batches_and_get_their_own_results():
    model = Model()
    engine, stats = _engine(model, max_batch_size=64)
    rng = random.Random(7)
    requests = [[rng.randint(1, 50) for _ in range(rng.randint(1, 6))] for _ in range(20)]
    results = await asyncio.gather(*(engine.submit(items) for items in requests))
    assert results == [[item * 10 for item in items] for items in requests]
    assert max(s.requests for s in stats) > 1, "items of different requests shared a batch"
    assert sum(s.items for s in stats) == sum(map(len, requests))
    await engine.stop()


async def test_batches_are_length_sorted_and_respect_both_limits():
    model = Model()
    engine, stats = _engine(model, max_batch_size=4, max_batch_tokens=100)
    items = [5, 40, 3, 25, 25, 10, 1, 30, 2, 8]
    assert await engine.submit(items) == [i * 10 for i in items]
    for batch in model.batches:
        assert batch == sorted(batch, reverse=True)
        assert len(batch) <= 4
        assert len(batch) == 1 or len(batch) * max(batch) <= 100
    assert all(s.padded_tokens >= s.tokens for s in stats)
    await engine.stop()


async def test_arrival_policy_keeps_arrival_order_under_the_same_limits():
    model = Model()
    engine, _ = _engine(model, max_batch_size=4, max_batch_tokens=100, policy="arrival")
    items = [5, 40, 3, 25, 25, 10, 1, 30, 2, 8]
    assert await engine.submit(items) == [i * 10 for i in items]
    assert [item for batch in model.batches for item in batch] == items
    for batch in model.batches:
        assert len(batch) <= 4
        assert len(batch) == 1 or len(batch) * max(batch) <= 100
    await engine.stop()


async def test_request_policy_never_mixes_requests_in_a_batch():
    model = Model()
    engine, stats = _engine(model, max_batch_size=64, policy="request")
    requests = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    results = await asyncio.gather(*(engine.submit(items) for items in requests))
    assert results == [[item * 10 for item in items] for items in requests]
    assert all(s.requests == 1 for s in stats)
    assert sorted(map(sorted, model.batches)) == sorted(map(sorted, requests))
    await engine.stop()


async def test_window_policy_sorts_across_requests():
    model = Model()
    engine, stats = _engine(model, max_batch_size=2, policy="window")
    requests = [[1, 9], [8, 2], [3, 7]]
    # All three requests are queued before the consumer wakes.
    await asyncio.gather(*(engine.submit(items) for items in requests))
    assert model.batches == [[9, 8], [7, 3], [2, 1]]
    assert [s.requests for s in stats] == [2, 1, 2]
    await engine.stop()


async def test_continuous_policy_runs_the_oldest_item_first_with_others_of_its_length():
    model = Model()
    engine, _ = _engine(model, max_batch_size=2)
    requests = [[1, 9], [8, 2], [3, 7]]
    await asyncio.gather(*(engine.submit(items) for items in requests))
    # The oldest item (1) runs first, with the nearest length of the look-ahead (2).
    assert model.batches[0] == [2, 1]
    assert sorted(map(sorted, model.batches)) == [[1, 2], [3, 7], [8, 9]]
    await engine.stop()


@pytest.mark.parametrize(("policy", "progressive"), [("continuous", True), ("window", False)])
async def test_under_closed_loop_load_requests_finish_batch_by_batch(
    policy: str, progressive: bool
):
    """Clients that send again once answered: the continuous engine answers requests in most
    batches, a window engine only when its window's last batch ends (a convoy)."""

    def run(items: Sequence[int]) -> list[int]:
        time.sleep(0.002)  # the device works for a while
        return [item * 10 for item in items]

    stats: list[BatchStats] = []
    engine: BatchEngine[int, list[int], int] = BatchEngine(
        "closed-loop",
        collate=list,
        run=run,
        length=int,
        limits=EngineLimits(4, 10_000, max_wait_ms=1.0, policy=policy),  # type: ignore[arg-type]
        on_batch=[stats.append],
    )
    engine.start()
    rng = random.Random(3)

    async def client() -> None:
        for _ in range(4):
            items = [rng.randint(1, 60) for _ in range(4)]
            assert await engine.submit(items) == [i * 10 for i in items]

    await asyncio.gather(*(client() for _ in range(8)))
    finishing = sum(1 for s in stats if s.finished)
    assert sum(s.finished for s in stats) == 32
    assert (finishing > len(stats) / 2) is progressive, [s.finished for s in stats]
    await engine.stop()


async def test_each_batch_reports_its_stages_and_the_device_clock_counts_it():
    model = Model()
    engine, stats = _engine(model, max_batch_size=2)
    await engine.prepare(sum, [1, 2])
    await engine.submit([5, 4, 3])
    assert {"queue_wait", "collate", "h2d", "forward", "d2h", "answer"} <= set(stats[0].stages)
    assert all(value >= 0 for s in stats for value in s.stages.values())
    totals = engine.totals.snapshot()
    assert totals["tokenise"] > 0 and totals["forward"] > 0
    assert engine.clock.busy_s > 0
    await engine.stop()


async def test_a_fetched_pass_is_read_back_off_the_model_thread():
    threads: list[str] = []

    def fetch(launched: list[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        return [item * 10 for item in launched]

    engine: BatchEngine[int, list[int], int] = BatchEngine(
        "fetching",
        collate=list,
        run=list,
        fetch=fetch,
        length=int,
        limits=EngineLimits(4, 1000, max_wait_ms=0.0),
    )
    engine.start()
    assert await engine.submit([1, 2, 3]) == [10, 20, 30]
    assert threads and all(t.startswith("ragrank-fetching-fetch") for t in threads)
    await engine.stop()


async def test_out_of_memory_splits_the_batch_and_fails_only_what_cannot_fit():
    model = Model(fits=60)
    engine, _ = _engine(model, max_batch_size=16)
    small, huge = [10, 12, 9, 11, 10], [70]
    results = await asyncio.gather(
        engine.submit(small), engine.submit(huge), return_exceptions=True
    )
    assert results[0] == [i * 10 for i in small]
    assert isinstance(results[1], ItemTooLargeError)
    assert all(len(b) * max(b) <= 60 for b in model.batches)
    assert engine.ready
    await engine.stop()


async def test_a_full_queue_refuses_with_queue_full():
    gate = threading.Event()
    engine, _ = _engine(Model(gate=gate), max_queue_items=4, max_wait_ms=0.0)
    first = asyncio.create_task(engine.submit([1]))
    await asyncio.sleep(0.1)  # the first request is now in the worker, the queue is empty
    second = asyncio.create_task(engine.submit([2]))
    await asyncio.sleep(0.1)  # collated, next in line for the worker
    third = asyncio.create_task(engine.submit([1, 2, 3, 4]))
    await asyncio.sleep(0.1)
    assert engine.queue_depth == 4
    with pytest.raises(QueueFullError) as refused:
        await engine.submit([5])
    assert refused.value.retry_after >= 1
    gate.set()
    assert await first == [10]
    assert await second == [20]
    assert await third == [10, 20, 30, 40]
    await engine.stop()


async def test_timed_out_and_cancelled_requests_are_dropped_from_the_queue():
    gate = threading.Event()
    model = Model(gate=gate)
    engine, _ = _engine(model, timeout_s=0.3, max_wait_ms=0.0)
    blocker = asyncio.create_task(engine.submit([1], timeout_s=10))
    await asyncio.sleep(0.1)
    with pytest.raises(RequestTimeoutError):
        await engine.submit([2, 3])
    cancelled = asyncio.create_task(engine.submit([4], timeout_s=10))
    await asyncio.sleep(0.05)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    gate.set()
    assert await blocker == [10]
    assert await engine.submit([5]) == [50]
    ran = [item for batch in model.batches for item in batch]
    assert 2 not in ran and 3 not in ran and 4 not in ran
    await engine.stop()


async def test_a_model_error_fails_its_batch_but_the_engine_carries_on():
    calls = {"n": 0}

    def flaky(items: Sequence[int]) -> list[int]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("boom /secret/path")
        return [i * 10 for i in items]

    engine: BatchEngine[int, list[int], int] = BatchEngine(
        "flaky", collate=list, length=int, run=flaky, limits=EngineLimits(8, 1000, max_wait_ms=0.0)
    )
    engine.start()
    with pytest.raises(ModelError) as failed:
        await engine.submit([1])
    assert "/secret/path" not in str(failed.value)
    assert engine.ready
    assert await engine.submit([2]) == [20]
    await engine.stop()


async def test_a_dead_worker_fails_pending_and_new_requests_and_is_not_ready():
    def fatal(items: Sequence[int]) -> list[int]:
        raise ModelFailedError("CUDA error: device-side assert triggered")

    engine: BatchEngine[int, list[int], int] = BatchEngine(
        "dying", collate=list, length=int, run=fatal, limits=EngineLimits(2, 1000, max_wait_ms=10.0)
    )
    engine.start()
    results = await asyncio.gather(
        engine.submit([1, 2, 3]), engine.submit([4]), return_exceptions=True
    )
    assert all(isinstance(r, EngineUnavailableError) for r in results)
    assert not engine.ready
    with pytest.raises(EngineUnavailableError, match="died"):
        await engine.submit([5])
    await engine.stop()


async def test_stop_drains_queued_work_then_refuses():
    model = Model()
    engine, _ = _engine(model, max_batch_size=2, max_wait_ms=0.0)
    pending = [asyncio.create_task(engine.submit([i, i + 1])) for i in range(1, 20, 2)]
    await asyncio.sleep(0.01)
    await engine.stop()
    assert [await task for task in pending] == [[i * 10, (i + 1) * 10] for i in range(1, 20, 2)]
    with pytest.raises(EngineUnavailableError):
        await engine.submit([1])


class Pipeline:
    """A model whose forward passes wait on a gate, recording where and when collating ran."""

    def __init__(self, *, fits: int | None = None, fatal_on: int | None = None) -> None:
        self.gate = threading.Event()
        self.fits = fits
        self.fatal_on = fatal_on
        self.running = threading.Event()
        self.started = 0
        self.finished = 0
        #: (items, thread, forward passes finished when it was collated) per collate call.
        self.collated: list[tuple[list[int], str, int]] = []
        self.ran: list[list[int]] = []

    def collate(self, items: Sequence[int]) -> list[int]:
        self.collated.append((list(items), threading.current_thread().name, self.finished))
        return list(items)

    def run(self, items: list[int]) -> list[int]:
        self.started += 1
        self.running.set()
        self.gate.wait(10)
        try:
            if self.fatal_on is not None and self.fatal_on in items:
                raise ModelFailedError("CUDA error: device-side assert triggered")
            if self.fits is not None and len(items) * max(items) > self.fits:
                raise BatchTooLargeError("simulated CUDA out of memory")
            self.ran.append(items)
            return [item * 10 for item in items]
        finally:
            self.finished += 1


def _pipeline(
    model: Pipeline, load: DeviceLoad | None = None, **limits: object
) -> BatchEngine[int, list[int], int]:
    settings = {"max_batch_size": 2, "max_batch_tokens": 10_000, "max_wait_ms": 0.0, **limits}
    engine: BatchEngine[int, list[int], int] = BatchEngine(
        "prefetch",
        collate=model.collate,
        run=model.run,
        length=int,
        limits=EngineLimits(**settings),  # type: ignore[arg-type]
        load=load,
    )
    engine.start()
    return engine


async def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_the_next_batch_is_collated_on_its_own_thread_while_one_runs():
    model = Pipeline()
    engine = _pipeline(model)
    task = asyncio.ensure_future(engine.submit([9, 8, 7, 6, 5, 4]))
    await _until(lambda: model.running.is_set() and len(model.collated) >= 2)
    # The second batch was collated while the first was still in the model.
    assert model.collated[1][2] == 0 and model.finished == 0
    assert all(thread.startswith("ragrank-prefetch-collate") for _, thread, _ in model.collated)
    assert len(model.collated) == 2, "no more than one batch is prepared ahead"
    model.gate.set()
    assert await task == [90, 80, 70, 60, 50, 40]
    await engine.stop()


async def test_a_batch_queued_behind_a_running_one_needs_no_event_loop_turn():
    """The model thread goes from batch N to batch N+1 by itself: with the event loop blocked,
    the queued pass still starts."""
    model = Pipeline()
    engine = _pipeline(model)
    task = asyncio.ensure_future(engine.submit([9, 8, 7, 6]))
    await _until(lambda: model.running.is_set() and len(model.collated) == 2)
    await asyncio.sleep(0.05)  # the second batch is now queued on the model thread
    model.gate.set()
    # Block the event loop: only the model thread can start the second pass now.
    deadline = time.monotonic() + 5
    while model.started < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert model.started == 2
    assert await task == [90, 80, 70, 60]
    await engine.stop()


async def test_out_of_memory_with_a_batch_in_flight_still_answers_everything():
    model = Pipeline(fits=30)
    engine = _pipeline(model, max_batch_size=4)
    task = asyncio.ensure_future(engine.submit([9, 8, 7, 6, 5, 4, 3, 2]))
    await _until(lambda: len(model.collated) >= 2)
    model.gate.set()
    assert await task == [90, 80, 70, 60, 50, 40, 30, 20]
    assert all(len(batch) * max(batch) <= 30 for batch in model.ran)
    assert engine.ready
    await engine.stop()


async def test_a_full_queue_answers_queue_full_with_a_batch_in_flight():
    model = Pipeline()
    engine = _pipeline(model, max_queue_items=4)
    running = asyncio.ensure_future(engine.submit([9, 8, 7, 6]))
    await _until(lambda: len(model.collated) == 2)
    queued = asyncio.ensure_future(engine.submit([1, 2, 3, 4]))
    await asyncio.sleep(0.05)
    with pytest.raises(QueueFullError):
        await engine.submit([5])
    model.gate.set()
    assert await running == [90, 80, 70, 60]
    assert await queued == [10, 20, 30, 40]
    await engine.stop()


async def test_timed_out_and_cancelled_items_are_dropped_with_a_batch_in_flight():
    model = Pipeline()
    engine = _pipeline(model)
    running = asyncio.ensure_future(engine.submit([9, 8, 7, 6], timeout_s=10))
    await _until(lambda: len(model.collated) == 2)
    with pytest.raises(RequestTimeoutError):
        await engine.submit([3, 2], timeout_s=0.1)
    cancelled = asyncio.ensure_future(engine.submit([5, 4], timeout_s=10))
    await asyncio.sleep(0.05)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    model.gate.set()
    assert await running == [90, 80, 70, 60]
    assert await engine.submit([1]) == [10]
    ran = {item for batch in model.ran for item in batch}
    assert not ran & {2, 3, 4, 5}
    await engine.stop()


async def test_a_dead_model_with_a_batch_in_flight_fails_everything_pending():
    model = Pipeline(fatal_on=9)
    engine = _pipeline(model)
    first = asyncio.ensure_future(engine.submit([9, 8, 7, 6]))
    await _until(lambda: len(model.collated) == 2)
    later = asyncio.ensure_future(engine.submit([1, 2]))
    await asyncio.sleep(0.05)
    model.gate.set()
    results = await asyncio.gather(first, later, return_exceptions=True)
    assert all(isinstance(r, EngineUnavailableError) for r in results), results
    assert not engine.ready
    await engine.stop()


async def test_stop_drains_work_in_flight_and_queued():
    model = Pipeline()
    engine = _pipeline(model)
    tasks = [asyncio.ensure_future(engine.submit([i + 1, i + 2])) for i in range(0, 12, 2)]
    await _until(lambda: len(model.collated) == 2)
    stopping = asyncio.ensure_future(engine.stop())
    await asyncio.sleep(0.05)
    model.gate.set()
    await stopping
    assert [await task for task in tasks] == [[(i + 1) * 10, (i + 2) * 10] for i in range(0, 12, 2)]


async def test_packed_batches_are_budgeted_by_real_tokens_and_report_no_padding():
    model = Model()
    engine, stats = _engine(model, max_batch_size=64, max_batch_tokens=100, packed=True)
    items = [60, 30, 10, 5, 5, 40]
    assert await engine.submit(items) == [i * 10 for i in items]
    assert all(sum(batch) <= 100 for batch in model.batches)
    # The oldest items that fit 100 real tokens; padded, these three would cost 180.
    assert model.batches[0] == [60, 30, 10]
    assert all(s.padded_tokens == s.tokens for s in stats)
    await engine.stop()


async def test_two_models_on_one_device_take_turns_and_neither_starves():
    """A model with five batches queued and another with three, sharing the device: once both
    wait, their forward passes alternate, so the second model's last batch runs before the
    first model's backlog is done."""
    order: list[str] = []
    running, gate = threading.Event(), threading.Event()

    def runner(name: str):
        def run(items: Sequence[int]) -> list[int]:
            if not order:
                running.set()
                gate.wait(10)
            order.append(f"{name}{items[0]}")
            # A forward pass takes a while: each engine's next batch is collated and waiting
            # for the device before the running one ends, as on a real device.
            time.sleep(0.05)
            return [item * 10 for item in items]

        return run

    turns = DeviceTurns()
    limits = {"max_batch_size": 1, "max_batch_tokens": 10_000, "max_wait_ms": 0.0}
    limits["policy"] = "arrival"
    engines = {
        name: BatchEngine(
            "rerank",
            collate=list,
            run=runner(name),
            length=int,
            limits=EngineLimits(**limits),  # type: ignore[arg-type]
            model=name,
            turns=turns,
        )
        for name in ("a", "b")
    }
    for engine in engines.values():
        engine.start()
    first = [asyncio.ensure_future(engines["a"].submit([i])) for i in range(1, 6)]
    await asyncio.to_thread(running.wait, 10)
    second = [asyncio.ensure_future(engines["b"].submit([i])) for i in range(1, 4)]
    for _ in range(500):  # until b's first batch waits for its turn
        if turns.waiting:
            break
        await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(*first, *second)
    # b's waiting batch runs right after the one that held the device, not after a's backlog;
    # then the two hand over (which asks first depends on the threads) until b has run out.
    assert order[:2] == ["a1", "b1"]
    assert order.index("b3") < order.index("a5")
    assert sorted(order) == ["a1", "a2", "a3", "a4", "a5", "b1", "b2", "b3"]
    for engine in engines.values():
        await engine.stop()


def test_device_turns_hand_over_in_the_order_they_were_asked_for():
    turns = DeviceTurns()
    order: list[int] = []
    turns.__enter__()

    def wait_for_turn(index: int) -> None:
        time.sleep(0.05 * index)  # ask in index order
        with turns:
            order.append(index)

    threads = [threading.Thread(target=wait_for_turn, args=(i,)) for i in range(1, 4)]
    for thread in threads:
        thread.start()
    for _ in range(500):
        if turns.waiting == 3:
            break
        time.sleep(0.01)
    assert order == []  # nobody runs while the device is held
    turns.__exit__(None, None, None)
    for thread in threads:
        thread.join(5)
    assert order == [1, 2, 3]


async def test_interactive_work_waits_at_most_for_the_bulk_batch_already_running():
    """Bulk work (indexing) starts a batch only while the device is idle and no request waits:
    a request that arrives behind a queue of bulk work runs right after the one bulk batch on
    the device, and the bulk queue goes on after it."""
    model = Pipeline()
    engine = _pipeline(model)
    bulk = asyncio.ensure_future(engine.submit([1, 2, 3, 4, 5, 6], bulk=True))
    await _until(model.running.is_set)
    # One bulk batch on the device and none collated behind it, though four items wait.
    assert len(model.collated) == 1 and engine.queue_depth == 4
    request = asyncio.ensure_future(engine.submit([9]))
    await _until(lambda: len(model.collated) == 2)
    assert model.collated[1][0] == [9], "the request is prepared behind the running batch"
    model.gate.set()
    assert await request == [90]
    assert await bulk == [10, 20, 30, 40, 50, 60]
    order = [batch for batch in model.ran]
    assert order[1] == [9], "the request ran second, before the rest of the bulk work"
    await engine.stop()


async def test_bulk_batches_are_reported_as_bulk():
    model = Model()
    engine, stats = _engine(model, max_batch_size=2)
    await engine.submit([3, 4], bulk=True)
    await engine.submit([5])
    assert [s.bulk for s in stats] == [True, False]
    await engine.stop()


async def test_bulk_work_waits_while_another_engine_on_the_device_serves_a_request():
    """An embedder's indexing batches do not start while the reranker on the same device has a
    request waiting or running; they resume once it is answered."""
    load = DeviceLoad()
    embedder, reranker = Pipeline(), Pipeline()
    embedding = _pipeline(embedder, load=load)
    reranking = _pipeline(reranker, load=load)
    request = asyncio.ensure_future(reranking.submit([7]))
    await _until(reranker.running.is_set)
    bulk = asyncio.ensure_future(embedding.submit([1, 2], bulk=True))
    await asyncio.sleep(0.05)
    assert embedder.started == 0, "bulk work started while a request was on the device"
    embedder.gate.set()
    reranker.gate.set()
    assert await request == [70]
    assert await bulk == [10, 20]
    await embedding.stop()
    await reranking.stop()
