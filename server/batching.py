"""One batching engine per model, shared by every request.

A request's items (token ids, tokenised once on a host thread) go on a bounded queue with an
event-loop future. One consumer task waits a short window for more work, sorts what it took by
token length, and cuts it into batches under a token budget (padded tokens, or real tokens when
the model packs its batches) and a size cap. Items from concurrent requests share batches; each
result goes back to its request and position.

Host work overlaps the model: while batch N runs in the model's thread, batch N+1 is collated on
the host pool and queued right behind it, so the model thread goes from one forward pass to the
next without waiting for the event loop, and results are handed back meanwhile.

The engine knows nothing of torch: the model side is two callables, `collate` (items into a
batch, on the host pool) and `run` (one forward pass, in the model's thread).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

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
from ragrank.settings import Batching

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

#: How a window of queued items becomes batches. `sorted` (the default): items of all waiting
#: requests, longest first, cut by the padded-token budget. `arrival`: the same, in arrival order
#: (a baseline for the benchmark). `request`: one request at a time, sorted, no sharing.
BatchPolicy = Batching

Item = TypeVar("Item")
Collated = TypeVar("Collated")
Output = TypeVar("Output")
Prepared = TypeVar("Prepared")

#: Batches collated or running at once: one in the model, the next queued behind it.
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


@dataclass(frozen=True)
class BatchStats:
    """What one forward pass held: for metrics and tests."""

    engine: str
    #: The served model's name (one engine per model).
    model: str
    items: int
    requests: int
    tokens: int
    padded_tokens: int
    seconds: float


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


@dataclass
class EngineLimits:
    max_batch_size: int
    max_batch_tokens: int
    max_wait_ms: float = 5.0
    max_queue_items: int = 4096
    timeout_s: float = 60.0
    policy: BatchPolicy = "sorted"
    #: The model packs batches without padding: the budget counts real tokens.
    packed: bool = False


@dataclass(eq=False)
class BatchEngine(Generic[Item, Collated, Output]):
    """Batches items of concurrent requests for one model."""

    name: str
    collate: Callable[[Sequence[Item]], Collated]
    run: Callable[[Collated], Sequence[Output]]
    limits: EngineLimits
    #: An item's tokens (model inputs know their length).
    length: Callable[[Any], int] = len
    #: The host pool for tokenising and collating; the engine makes its own (one thread) if
    #: none is given, and then shuts it down on `stop`.
    pool: Executor | None = None
    on_batch: list[Callable[[BatchStats], None]] = field(default_factory=list)
    #: The served model's name, for metrics and errors.
    model: str = ""
    #: Shared with the engines of other models on the same device: their forward passes
    #: alternate instead of contending.
    turns: DeviceTurns | None = None

    def __post_init__(self) -> None:
        self._queue: deque[_Work[Item]] = deque()
        self._wakeup = asyncio.Event()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=f"ragrank-{self.name}")
        self._own_pool = self.pool is None
        self._host: Executor = self.pool or ThreadPoolExecutor(
            1, thread_name_prefix=f"ragrank-{self.name}-host"
        )
        #: Work taken off the queue and not yet answered: formed, collating or running.
        self._window: list[_Work[Item]] = []
        self._consumer: asyncio.Task[None] | None = None
        self._stopping = False
        self._dead: BaseException | None = None

    @property
    def ready(self) -> bool:
        return self._consumer is not None and not self._stopping and self._dead is None

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

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
        self._fail_queued(EngineUnavailableError(f"the {self.name} engine has stopped"))
        self._worker.shutdown(wait=False, cancel_futures=True)
        if self._own_pool:
            self._host.shutdown(wait=False, cancel_futures=True)

    async def prepare(self, function: Callable[..., Prepared], *args: Any) -> Prepared:
        """Run host-side preparation of a request (tokenising, planning) on the host pool,
        off the event loop."""
        self._check_accepting()
        return await asyncio.get_running_loop().run_in_executor(self._host, function, *args)

    async def submit(
        self, items: Sequence[Item], *, timeout_s: float | None = None
    ) -> list[Output]:
        """Queue `items` (each sized by its tokens), wait for all their outputs, return them in
        order. `timeout_s` (default: the engine's) bounds the wait, and on expiry the items still
        queued are dropped."""
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        self._check_accepting()
        if not items:
            return []
        self._check_room(len(items))
        loop = asyncio.get_running_loop()
        request = _Request(
            future=loop.create_future(), outputs=[None] * len(items), remaining=len(items)
        )
        self._queue.extend(
            _Work(request, index, item, self.length(item)) for index, item in enumerate(items)
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

    def _check_room(self, count: int) -> None:
        if len(self._queue) + count > self.limits.max_queue_items:
            raise QueueFullError(
                f"the {self.name} queue is full ({len(self._queue)} of "
                f"{self.limits.max_queue_items} items waiting); retry shortly"
            )

    def _check_accepting(self) -> None:
        if self._dead is not None:
            raise EngineUnavailableError(f"the {self.name} engine's worker has died")
        if self._stopping or self._consumer is None:
            raise EngineUnavailableError(f"the {self.name} engine is not running")

    async def _consume(self) -> None:
        formed: deque[list[_Work[Item]]] = deque()
        in_flight: deque[asyncio.Task[None]] = deque()
        try:
            while True:
                if len(in_flight) >= PREFETCH_DEPTH:
                    await in_flight.popleft()
                    continue
                if not formed:
                    if not self._queue:
                        if in_flight:
                            await in_flight.popleft()
                            continue
                        if self._stopping:
                            return
                        self._window = []
                        self._wakeup.clear()
                        await self._wakeup.wait()
                        continue
                    if (
                        not in_flight
                        and len(self._queue) < self.limits.max_batch_size
                        and not self._stopping
                    ):
                        # A short window lets concurrent requests join the same batches.
                        await asyncio.sleep(self.limits.max_wait_ms / 1000)
                    window = self._take_window()
                    self._window = [w for w in self._window if not w.request.future.done()]
                    self._window.extend(window)
                    formed.extend(self._form_batches(window))
                    continue
                batch = [work for work in formed.popleft() if not work.request.abandoned]
                if batch:
                    in_flight.append(asyncio.ensure_future(self._collate_and_run(batch)))
        finally:
            for task in in_flight:
                task.cancel()

    def _take_window(self) -> list[_Work[Item]]:
        """Up to 32 batches' worth of live work, oldest first (under the `request` policy,
        from the oldest request only)."""
        window: list[_Work[Item]] = []
        # Up to 32 batches' worth: sorting more items leaves less padding (on SciFact pairs,
        # 6 % of the tokens with 8 batches, 2.4 % with 32; `ragrank bench`).
        cap = self.limits.max_batch_size * 32
        while self._queue and len(window) < cap:
            another_request = window and self._queue[0].request is not window[0].request
            if self.limits.policy == "request" and another_request:
                break
            work = self._queue.popleft()
            if not work.request.abandoned:
                window.append(work)
        return window

    def _cost(self, count: int, longest: int, total: int) -> int:
        """Tokens a batch costs: real ones when packed, else padded ones."""
        return total if self.limits.packed else count * longest

    def _form_batches(self, window: list[_Work[Item]]) -> list[list[_Work[Item]]]:
        """Longest first (or in arrival order); a batch grows while its cost fits the token
        budget."""
        if self.limits.policy != "arrival":
            window = sorted(window, key=lambda w: w.length, reverse=True)
        batches: list[list[_Work[Item]]] = []
        current: list[_Work[Item]] = []
        longest = total = 0
        for work in window:
            cost = self._cost(len(current) + 1, max(longest, work.length), total + work.length)
            if current and (
                len(current) >= self.limits.max_batch_size or cost > self.limits.max_batch_tokens
            ):
                batches.append(current)
                current, longest, total = [], 0, 0
            current.append(work)
            longest = max(longest, work.length)
            total += work.length
        if current:
            batches.append(current)
        return batches

    async def _collate_and_run(self, batch: list[_Work[Item]]) -> None:
        """Collate on the host pool, then queue the forward pass on the model's thread (behind
        the one running, if any), then hand each output back."""
        loop = asyncio.get_running_loop()
        try:
            collated = await loop.run_in_executor(self._host, self.collate, [w.item for w in batch])
        except Exception as exc:
            self._fail_batch(batch, exc, "collating")
            return
        batch = [work for work in batch if not work.request.abandoned]
        if not batch:
            return
        started = loop.time()
        try:
            outputs = await loop.run_in_executor(self._worker, self._run_in_turn, collated)
        except BatchTooLargeError:
            if len(batch) == 1:
                batch[0].request.fail(
                    ItemTooLargeError(
                        f"an input of {batch[0].length} tokens does not fit on the device"
                    )
                )
                return
            middle = len(batch) // 2
            log.warning("%s: out of memory on %d items; splitting", self.name, len(batch))
            await self._collate_and_run(batch[:middle])
            await self._collate_and_run(batch[middle:])
            return
        except ModelFailedError:
            raise  # the consumer dies; `_consumer_exited` fails everything pending
        except Exception as exc:
            self._fail_batch(batch, exc, "running")
            return
        self._report(batch, loop.time() - started)
        for work, output in zip(batch, outputs, strict=True):
            request = work.request
            request.outputs[work.index] = output
            request.remaining -= 1
            if request.remaining == 0 and not request.future.done():
                request.future.set_result(request.outputs)

    def _run_in_turn(self, collated: Collated) -> Sequence[Output]:
        if self.turns is None:
            return self.run(collated)
        with self.turns:
            return self.run(collated)

    def _fail_batch(self, batch: list[_Work[Item]], exc: Exception, stage: str) -> None:
        log.exception(
            "%s: %s a batch of %d items failed", self.name, stage, len(batch), exc_info=exc
        )
        for work in batch:
            # Details stay in the log: exception texts can carry paths.
            work.request.fail(ModelError(f"the {self.name} model failed on this request"))

    def _report(self, batch: list[_Work[Item]], seconds: float) -> None:
        if not self.on_batch:
            return
        tokens = sum(work.length for work in batch)
        stats = BatchStats(
            engine=self.name,
            model=self.model,
            items=len(batch),
            requests=len({id(work.request) for work in batch}),
            tokens=tokens,
            padded_tokens=self._cost(len(batch), max(work.length for work in batch), tokens),
            seconds=seconds,
        )
        for hook in self.on_batch:
            hook(stats)

    def _consumer_exited(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is None and self._stopping:
            return
        self._dead = error or EngineUnavailableError("the consumer stopped")
        log.error("%s engine died: %r", self.name, self._dead)
        self._fail_queued(EngineUnavailableError(f"the {self.name} engine's worker has died"))

    def _fail_queued(self, error: RagrankError) -> None:
        for work in self._window:
            work.request.fail(error)
        self._window = []
        while self._queue:
            self._queue.popleft().request.fail(error)
