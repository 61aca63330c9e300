"""One batching engine per model, shared by every request.

A request's items (token ids, tokenised once on a host thread) go on a bounded queue with an
event-loop future. One consumer task forms batches by the policy of `scheduling`: by default one
at a time, as the device is about to need it, from the oldest waiting work, so new requests join
the next batch while one runs and each request is answered as soon as its own batches are done.

Host work overlaps the model: while batch N runs in the model's thread, batch N+1 is collated
on the engine's own collating thread (never queued behind requests' tokenising on the host
pool) and queued right behind it, so the model thread goes from one forward pass to
the next without waiting for the event loop. A model that launches its forward pass and copies
the output back separately (`fetch`) has the copy waited for on a thread of its own, so the
next pass starts meanwhile.

The engine knows nothing of torch: the model side is callables, `collate` (items into a batch,
on the host pool), optionally `upload` (to the device), `run` (one forward pass, in the model's
thread) and optionally `fetch` (the outputs back on the host).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ragrank.engine.scheduling import (
    WINDOW_BATCHES,
    EngineLimits,
    batch_cost,
    lookahead,
    next_batch,
    window_batches,
)
from ragrank.engine.timings import DeviceClock, StageTotals
from ragrank.errors import (
    BatchTooLargeError,
    EngineUnavailableError,
    ItemTooLargeError,
    ModelError,
    ModelFailedError,
    QueueFullError,
    RagrankError,
    RequestTimeoutError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from ragrank.protocols import Embedder, Scorer, Vectors
    from ragrank.tokens import ModelInput

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Collated = TypeVar("Collated")
Output = TypeVar("Output")
Prepared = TypeVar("Prepared")

#: Batches formed and not yet answered: one in the model, the next collated behind it.
PREFETCH_DEPTH = 2


class DeviceTurns:
    """Forward passes of several models on one device, one at a time, in the order they asked
    for it: a model with a long queue hands the device to the next model's waiting batch after
    each of its own, so neither starves the other. Used from the models' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self._busy = False

    def __enter__(self) -> None:
        with self._lock:
            if not self._busy:
                self._busy = True
                return
            turn = threading.Event()
            self._waiting.append(turn)
        turn.wait()  # the device is handed over, still busy, by `__exit__`

    @property
    def waiting(self) -> int:
        """Forward passes waiting for the device."""
        return len(self._waiting)

    def __exit__(self, *_: object) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()
            else:
                self._busy = False


class DeviceLoad:
    """The interactive work of every engine on one device: a bulk batch of any of them starts
    only while none of them has a request waiting or running, so that indexing with one model
    never slows a search that is being reranked by another. Used from the event loop."""

    def __init__(self) -> None:
        self._engines: list[BatchEngine[Any, Any, Any]] = []
        #: Requests that run several models in turn (a search: embed, then rerank) and are
        #: between two of them.
        self._sessions = 0

    def join(self, engine: BatchEngine[Any, Any, Any]) -> None:
        self._engines.append(engine)

    @property
    def interactive(self) -> bool:
        """Whether a request is waiting or running on the device, or between its models."""
        return self._sessions > 0 or any(e.interactive_pending for e in self._engines)

    @contextmanager
    def session(self) -> Iterator[None]:
        """Hold bulk work back for the whole of a request that uses several models, so that
        no indexing batch slips in between its embedding and its reranking."""
        self._sessions += 1
        try:
            yield
        finally:
            self._sessions -= 1
            if not self.interactive:
                self.settled()

    def settled(self) -> None:
        """An engine's interactive batch ended: the others may start bulk work again."""
        for engine in self._engines:
            engine.wake()


@dataclass(frozen=True)
class BatchStats:
    """What one forward pass held and where its time went: for metrics and tests."""

    engine: str
    #: The served model's name (one engine per model).
    model: str
    items: int
    requests: int
    tokens: int
    padded_tokens: int
    #: The forward pass, upload and copy back included.
    seconds: float
    #: Seconds by stage (`timings.STAGES`; `tokenise` is counted per request, not per batch).
    stages: Mapping[str, float] = field(default_factory=dict)
    #: Requests this batch finished.
    finished: int = 0
    #: Bulk work (indexing) rather than interactive (requests).
    bulk: bool = False


@dataclass(eq=False)
class _Request:
    future: asyncio.Future[list[Any]]
    outputs: list[Any]
    remaining: int
    abandoned: bool = False

    def fail(self, error: BaseException) -> None:
        nobody_waits = self.abandoned
        self.abandoned = True
        if not self.future.done():
            self.future.set_exception(error)
            if nobody_waits:
                self.future.exception()  # mark it retrieved: its caller has gone


@dataclass(eq=False)
class _Work(Generic[Item]):
    request: _Request
    index: int
    item: Item
    length: int
    #: When it was queued (`time.perf_counter`).
    arrived: float


@dataclass(frozen=True)
class _DeviceRun:
    """One forward pass as the model's thread saw it."""

    launched: Any
    started: float
    h2d_s: float
    forward_s: float


@dataclass(eq=False)
class BatchEngine(Generic[Item, Collated, Output]):
    """Batches items of concurrent requests for one model."""

    name: str
    collate: Callable[[Sequence[Item]], Collated]
    #: One forward pass: host outputs, or (with `fetch`) whatever `fetch` reads them from.
    run: Callable[[Any], Any]
    limits: EngineLimits
    #: An item's tokens (model inputs know their length).
    length: Callable[[Any], int] = len
    #: The host pool for tokenising (`prepare`); the engine makes its own (one thread) if none
    #: is given, and then shuts it down on `stop`.
    pool: Executor | None = None
    on_batch: list[Callable[[BatchStats], None]] = field(default_factory=list)
    #: The served model's name, for metrics and errors.
    model: str = ""
    #: Shared with the engines of other models on the same device: their forward passes
    #: alternate instead of contending.
    turns: DeviceTurns | None = None
    #: Moves a collated batch to the device, on the model's thread (timed as `h2d`).
    upload: Callable[[Collated], Any] | None = None
    #: Waits for a launched pass and reads its outputs, on a thread of its own (`d2h`).
    fetch: Callable[[Any], Sequence[Output]] | None = None
    #: Shared by every engine on the same device: bulk work waits for all their requests.
    load: DeviceLoad | None = None

    def __post_init__(self) -> None:
        # Two classes of work: interactive (requests) and bulk (indexing). A bulk batch starts
        # only when no interactive work waits and the device is idle, so interactive work
        # waits at most for the batch already running.
        self._queue: deque[_Work[Item]] = deque()
        self._bulk: deque[_Work[Item]] = deque()
        self._wakeup = asyncio.Event()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=f"ragrank-{self.name}")
        self._fetcher = ThreadPoolExecutor(1, thread_name_prefix=f"ragrank-{self.name}-fetch")
        # Collating has a thread of its own: on the shared host pool the next batch would
        # queue behind every waiting request's tokenising while the device idles.
        self._collator = ThreadPoolExecutor(1, thread_name_prefix=f"ragrank-{self.name}-collate")
        self._own_pool = self.pool is None
        self._host: Executor = self.pool or ThreadPoolExecutor(
            1, thread_name_prefix=f"ragrank-{self.name}-host"
        )
        #: Requests not yet answered, queued or in flight: what a dying engine fails.
        self._pending: set[_Request] = set()
        self._consumer: asyncio.Task[None] | None = None
        self._stopping = False
        self._dead: BaseException | None = None
        self._fatal: BaseException | None = None
        self.clock = DeviceClock()
        self.totals = StageTotals()
        #: A window policy's batches, formed from the queue and not yet started, in order.
        self._formed: deque[list[_Work[Item]]] = deque()
        #: Interactive batches started and not yet answered.
        self._interactive_in_flight = 0
        if self.load is not None:
            self.load.join(self)

    @property
    def ready(self) -> bool:
        return self._consumer is not None and not self._stopping and self._dead is None

    @property
    def interactive_pending(self) -> bool:
        """Requests' work queued or on its way through the device."""
        return bool(self._queue or self._formed) or self._interactive_in_flight > 0

    def wake(self) -> None:
        """Have the consumer look at the queues again."""
        self._wakeup.set()

    @property
    def queue_depth(self) -> int:
        """Items waiting, of both classes."""
        return len(self._queue) + len(self._bulk)

    def start(self) -> None:
        self._consumer = asyncio.get_running_loop().create_task(self._consume())
        self._consumer.add_done_callback(self._consumer_exited)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Refuse new work, finish what is queued (up to `timeout_s`), release the threads."""
        self._stopping = True
        self._wakeup.set()
        if self._consumer is not None and not self._consumer.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._consumer), timeout_s)
            except TimeoutError:
                self._consumer.cancel()
        self._fail_pending(EngineUnavailableError(f"the {self.name} engine has stopped"))
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._fetcher.shutdown(wait=False, cancel_futures=True)
        self._collator.shutdown(wait=False, cancel_futures=True)
        if self._own_pool:
            self._host.shutdown(wait=False, cancel_futures=True)

    async def prepare(self, function: Callable[..., Prepared], *args: Any) -> Prepared:
        """Run host-side preparation of a request (tokenising, planning) on the host pool,
        off the event loop; its time counts as the `tokenise` stage."""
        self._check_accepting()

        def timed() -> Prepared:
            started = time.perf_counter()
            try:
                return function(*args)
            finally:
                self.totals.add("tokenise", time.perf_counter() - started)

        return await asyncio.get_running_loop().run_in_executor(self._host, timed)

    async def submit(
        self, items: Sequence[Item], *, timeout_s: float | None = None, bulk: bool = False
    ) -> list[Output]:
        """Queue `items` (each sized by its tokens), wait for all their outputs, return them in
        order. `timeout_s` (default: the engine's) bounds the wait, and on expiry the items still
        queued are dropped. `bulk` work (indexing) runs only while no interactive work waits."""
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        self._check_accepting()
        if not items:
            return []
        queue = self._bulk if bulk else self._queue
        self._check_room(len(items), queue)
        loop = asyncio.get_running_loop()
        request = _Request(
            future=loop.create_future(), outputs=[None] * len(items), remaining=len(items)
        )
        self._pending.add(request)
        request.future.add_done_callback(lambda _: self._pending.discard(request))
        now = time.perf_counter()
        queue.extend(
            _Work(request, index, item, self.length(item), now) for index, item in enumerate(items)
        )
        self._wakeup.set()
        try:
            outputs = await asyncio.wait_for(asyncio.shield(request.future), timeout)
        except TimeoutError:
            request.abandoned = True
            raise RequestTimeoutError(
                f"the {self.name} engine did not finish within {timeout:g} s"
            ) from None
        except asyncio.CancelledError:
            # The caller went away (e.g. the client disconnected): drop its queued items.
            request.abandoned = True
            raise
        return outputs

    def _check_room(self, count: int, queue: deque[_Work[Item]]) -> None:
        if len(queue) + count > self.limits.max_queue_items:
            raise QueueFullError(
                f"the {self.name} queue is full ({len(queue)} of "
                f"{self.limits.max_queue_items} items waiting); retry shortly"
            )

    def _check_accepting(self) -> None:
        if self._dead is not None:
            raise EngineUnavailableError(f"the {self.name} engine's worker has died")
        if self._stopping or self._consumer is None:
            raise EngineUnavailableError(f"the {self.name} engine is not running")

    async def _consume(self) -> None:
        """Start a batch whenever fewer than `PREFETCH_DEPTH` are formed and unanswered and
        work waits; otherwise sleep until work arrives or a batch is answered."""
        formed = self._formed
        in_flight: set[asyncio.Task[None]] = set()

        def answered(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            if not task.cancelled() and isinstance(task.exception(), ModelFailedError):
                self._fatal = task.exception()
            self._wakeup.set()

        def answered_interactive(task: asyncio.Task[None]) -> None:
            self._interactive_in_flight -= 1
            answered(task)
            if self.load is not None and not self.interactive_pending:
                self.load.settled()

        try:
            while True:
                if self._fatal is not None:
                    raise self._fatal
                if len(in_flight) < PREFETCH_DEPTH and (self._queue or formed):
                    if not in_flight and not formed:
                        await self._gather_briefly()
                    batch = self._next_batch(formed)
                    if batch:
                        task = asyncio.ensure_future(self._collate_and_run(batch))
                        in_flight.add(task)
                        self._interactive_in_flight += 1
                        task.add_done_callback(answered_interactive)
                    continue
                if self._bulk and not in_flight and not self._device_serving():
                    batch = self._take_continuous(self._bulk, self.limits.bulk())
                    if batch:
                        task = asyncio.ensure_future(self._collate_and_run(batch, bulk=True))
                        in_flight.add(task)
                        task.add_done_callback(answered)
                    continue
                idle = not in_flight and not self._queue and not self._bulk and not formed
                if self._stopping and idle:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
        finally:
            for task in in_flight:
                task.cancel()

    def _device_serving(self) -> bool:
        """Whether another engine on the device has requests waiting or running."""
        return self.load is not None and self.load.interactive

    async def _gather_briefly(self) -> None:
        """Under a window policy, with the device idle and less than a batch waiting, wait
        `max_wait_ms` so that concurrent requests join the same window. The continuous policy
        starts at once: what arrives meanwhile joins the next batch."""
        if self.limits.policy == "continuous":
            return
        if len(self._queue) < self.limits.max_batch_size and not self._stopping:
            await asyncio.sleep(self.limits.max_wait_ms / 1000)

    def _next_batch(self, formed: deque[list[_Work[Item]]]) -> list[_Work[Item]]:
        """The next batch to start, by the policy; empty when all of it was abandoned."""
        if self.limits.policy == "continuous":
            return self._take_continuous(self._queue)
        if not formed:
            window = self._take_window()
            formed.extend(
                [window[i] for i in batch]
                for batch in window_batches([w.length for w in window], self.limits)
            )
        if not formed:
            return []
        return [work for work in formed.popleft() if not work.request.abandoned]

    def _take_continuous(
        self, queue: deque[_Work[Item]], limits: EngineLimits | None = None
    ) -> list[_Work[Item]]:
        """The oldest live items of `queue` that `next_batch` picks under `limits` (the
        engine's); the rest stay queued, in order."""
        limits = limits or self.limits
        look = lookahead(limits)
        pool: list[_Work[Item]] = []
        while queue and len(pool) < look:
            work = queue.popleft()
            if not work.request.abandoned:
                pool.append(work)
        chosen = next_batch([w.length for w in pool], limits)
        picked = set(chosen)
        queue.extendleft(reversed([w for i, w in enumerate(pool) if i not in picked]))
        return [pool[i] for i in chosen]

    def _take_window(self) -> list[_Work[Item]]:
        """Up to `WINDOW_BATCHES` batches' worth of live work, oldest first (under the `request`
        policy, from the oldest request only)."""
        window: list[_Work[Item]] = []
        cap = self.limits.max_batch_size * WINDOW_BATCHES
        while self._queue and len(window) < cap:
            another_request = window and self._queue[0].request is not window[0].request
            if self.limits.policy == "request" and another_request:
                break
            work = self._queue.popleft()
            if not work.request.abandoned:
                window.append(work)
        return window

    async def _collate_and_run(self, batch: list[_Work[Item]], *, bulk: bool = False) -> None:
        """Collate on the engine's own thread, queue the forward pass on the model's thread
        (behind the one running, if any), read its outputs back, then hand each output to its
        request."""
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        try:
            items = [w.item for w in batch]
            collated = await loop.run_in_executor(self._collator, self.collate, items)
        except Exception as exc:
            self._fail_batch(batch, exc, "collating")
            return
        collate_s = time.perf_counter() - began
        batch = [work for work in batch if not work.request.abandoned]
        if not batch:
            return
        try:
            ran = await loop.run_in_executor(self._worker, self._run_in_turn, collated, batch)
            if ran is None:
                return
            outputs, ended, d2h_s = await self._read_back(ran)
        except BatchTooLargeError:
            await self._split(batch, bulk=bulk)
            return
        except ModelFailedError:
            raise  # the consumer dies; `_consumer_exited` fails everything pending
        except Exception as exc:
            self._fail_batch(batch, exc, "running")
            return
        self.clock.ran(min(w.arrived for w in batch), ran.started, ended)
        answering = time.perf_counter()
        finished = self._answer(batch, outputs)
        stages = {
            "queue_wait": sum(ran.started - w.arrived for w in batch),
            "collate": collate_s,
            "h2d": ran.h2d_s,
            "forward": ran.forward_s,
            "d2h": d2h_s,
            "answer": time.perf_counter() - answering,
        }
        self._report(batch, ended - ran.started, stages, finished, bulk=bulk)

    async def _read_back(self, ran: _DeviceRun) -> tuple[Sequence[Output], float, float]:
        """The outputs on the host, when the pass ended, and the seconds the copy took."""
        if self.fetch is None:
            return ran.launched, ran.started + ran.h2d_s + ran.forward_s, 0.0
        fetch = self.fetch

        def timed() -> tuple[Sequence[Output], float, float]:
            began = time.perf_counter()
            outputs = fetch(ran.launched)
            ended = time.perf_counter()
            return outputs, ended, ended - began

        return await asyncio.get_running_loop().run_in_executor(self._fetcher, timed)

    async def _split(self, batch: list[_Work[Item]], *, bulk: bool) -> None:
        """Out of device memory: halve the batch and retry; an item alone that does not fit
        fails its request."""
        if len(batch) == 1:
            batch[0].request.fail(
                ItemTooLargeError(
                    f"an input of {batch[0].length} tokens does not fit on the device"
                )
            )
            return
        middle = len(batch) // 2
        log.warning("%s: out of memory on %d items; splitting", self.name, len(batch))
        await self._collate_and_run(batch[:middle], bulk=bulk)
        await self._collate_and_run(batch[middle:], bulk=bulk)

    def _answer(self, batch: list[_Work[Item]], outputs: Sequence[Output]) -> int:
        """Hand each output to its request; resolve the requests now complete."""
        finished = 0
        for work, output in zip(batch, outputs, strict=True):
            request = work.request
            request.outputs[work.index] = output
            request.remaining -= 1
            if request.remaining == 0 and not request.future.done():
                request.future.set_result(request.outputs)
                finished += 1
        return finished

    def _run_in_turn(self, collated: Collated, batch: list[_Work[Item]]) -> _DeviceRun | None:
        """The forward pass, in the device's turn; none when every request of the batch has
        gone (timed out or disconnected) while it waited."""
        if all(work.request.abandoned for work in batch):
            return None
        if self.turns is None:
            return self._run_on_device(collated)
        with self.turns:
            return self._run_on_device(collated)

    def _run_on_device(self, collated: Collated) -> _DeviceRun:
        started = time.perf_counter()
        moved = collated if self.upload is None else self.upload(collated)
        uploaded = time.perf_counter()
        launched = self.run(moved)
        return _DeviceRun(launched, started, uploaded - started, time.perf_counter() - uploaded)

    def _fail_batch(self, batch: list[_Work[Item]], exc: Exception, stage: str) -> None:
        log.exception(
            "%s: %s a batch of %d items failed", self.name, stage, len(batch), exc_info=exc
        )
        for work in batch:
            # Details stay in the log: exception texts can carry paths.
            work.request.fail(ModelError(f"the {self.name} model failed on this request"))

    def _report(
        self,
        batch: list[_Work[Item]],
        seconds: float,
        stages: dict[str, float],
        finished: int,
        *,
        bulk: bool,
    ) -> None:
        for stage, spent in stages.items():
            self.totals.add(stage, spent)
        if not self.on_batch:
            return
        tokens = sum(work.length for work in batch)
        longest = max(work.length for work in batch)
        stats = BatchStats(
            engine=self.name,
            model=self.model,
            items=len(batch),
            requests=len({id(work.request) for work in batch}),
            tokens=tokens,
            padded_tokens=batch_cost(len(batch), longest, tokens, packed=self.limits.packed),
            seconds=seconds,
            stages=stages,
            finished=finished,
            bulk=bulk,
        )
        for hook in self.on_batch:
            hook(stats)

    def _consumer_exited(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is None and self._stopping:
            return
        self._dead = error or EngineUnavailableError("the consumer stopped")
        log.error("%s engine died: %r", self.name, self._dead)
        self._fail_pending(EngineUnavailableError(f"the {self.name} engine's worker has died"))

    def _fail_pending(self, error: RagrankError) -> None:
        for request in list(self._pending):
            request.fail(error)
        self._pending.clear()
        self._queue.clear()
        self._bulk.clear()


def scoring_engine(
    name: str, scorer: Scorer, limits: EngineLimits, **options: Any
) -> BatchEngine[ModelInput, Any, float]:
    """An engine that runs `scorer` (collate, upload, launch, fetch), its outputs the float
    logits; `options` are the engine's other fields (pool, model, turns, on_batch)."""
    return BatchEngine(
        name,
        collate=scorer.collate,
        upload=scorer.upload,
        run=scorer.launch,
        fetch=lambda launched: scorer.fetch(launched).tolist(),
        limits=limits,
        **options,
    )


def embedding_engine(
    name: str, embedder: Embedder, limits: EngineLimits, **options: Any
) -> BatchEngine[ModelInput, Any, Vectors]:
    """An engine that runs `embedder`, its outputs one vector per input."""
    return BatchEngine(
        name,
        collate=embedder.collate,
        upload=embedder.upload,
        run=embedder.launch,
        fetch=lambda launched: list(embedder.fetch(launched)),
        limits=limits,
        **options,
    )
