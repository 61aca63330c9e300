"""One batching engine per model, shared by every request.

A request's items go on a bounded queue with an event-loop future. One consumer task waits a
short window for more work, sorts what it took by token length, cuts it into batches under a
padded-token budget and a size cap, and runs each batch in the model's dedicated thread. Items
from concurrent requests share batches; each result goes back to its request and position.

The engine knows nothing of torch: the model side is two callables, `lengths` (run in a
tokenizer thread, off the event loop) and `run` (one forward pass, in the worker thread).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

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

log = logging.getLogger(__name__)

#: How a window of queued items becomes batches. `sorted` (the default): items of all waiting
#: requests, longest first, cut by the padded-token budget. `arrival`: the same, in arrival order
#: (a baseline for the benchmark). `request`: one request at a time, sorted, no sharing.
BatchPolicy = Literal["sorted", "arrival", "request"]

Item = TypeVar("Item")
Output = TypeVar("Output")
Prepared = TypeVar("Prepared")


@dataclass(frozen=True)
class BatchStats:
    """What one forward pass held: for metrics and tests."""

    engine: str
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


@dataclass(eq=False)
class BatchEngine(Generic[Item, Output]):
    """Batches items of concurrent requests for one model."""

    name: str
    lengths: Callable[[Sequence[Item]], list[int]]
    run: Callable[[Sequence[Item]], Sequence[Output]]
    limits: EngineLimits
    on_batch: list[Callable[[BatchStats], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: deque[_Work[Item]] = deque()
        self._wakeup = asyncio.Event()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=f"ragrank-{self.name}")
        self._tokenizer = ThreadPoolExecutor(1, thread_name_prefix=f"ragrank-{self.name}-tok")
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
        self._tokenizer.shutdown(wait=False, cancel_futures=True)

    async def prepare(self, function: Callable[..., Prepared], *args: Any) -> Prepared:
        """Run CPU-side preparation of a request (tokenising, planning) on the engine's
        tokenizer thread, off the event loop."""
        self._check_accepting()
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer, function, *args)

    async def submit(
        self,
        items: Sequence[Item],
        *,
        lengths: Sequence[int] | None = None,
        timeout_s: float | None = None,
    ) -> list[Output]:
        """Queue `items`, wait for all their outputs, return them in order. `lengths` (token
        counts) saves tokenising items whose caller already did; `timeout_s` (default: the
        engine's) bounds the wait, and on expiry the items still queued are dropped."""
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        self._check_accepting()
        if not items:
            return []
        self._check_room(len(items))
        loop = asyncio.get_running_loop()
        if lengths is None:
            lengths = await loop.run_in_executor(self._tokenizer, self.lengths, items)
        # Checked again: other requests may have filled the queue while this one was tokenised.
        self._check_accepting()
        self._check_room(len(items))
        request = _Request(
            future=loop.create_future(), outputs=[None] * len(items), remaining=len(items)
        )
        self._queue.extend(
            _Work(request, index, item, length)
            for index, (item, length) in enumerate(zip(items, lengths, strict=True))
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
        while True:
            if not self._queue:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if len(self._queue) < self.limits.max_batch_size and not self._stopping:
                # A short window lets concurrent requests join the same batches.
                await asyncio.sleep(self.limits.max_wait_ms / 1000)
            self._window = self._take_window()
            for batch in self._form_batches(self._window):
                await self._run_batch(batch)
            self._window = []

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

    def _form_batches(self, window: list[_Work[Item]]) -> list[list[_Work[Item]]]:
        """Longest first (or in arrival order); a batch grows while its padded size fits the
        token budget."""
        if self.limits.policy != "arrival":
            window = sorted(window, key=lambda w: w.length, reverse=True)
        batches: list[list[_Work[Item]]] = []
        current: list[_Work[Item]] = []
        longest = 0
        for work in window:
            padded = (len(current) + 1) * max(longest, work.length)
            if current and (
                len(current) >= self.limits.max_batch_size or padded > self.limits.max_batch_tokens
            ):
                batches.append(current)
                current, longest = [], 0
            current.append(work)
            longest = max(longest, work.length)
        if current:
            batches.append(current)
        return batches

    async def _run_batch(self, batch: list[_Work[Item]]) -> None:
        batch = [work for work in batch if not work.request.abandoned]
        if not batch:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            outputs = await loop.run_in_executor(self._worker, self.run, [w.item for w in batch])
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
            await self._run_batch(batch[:middle])
            await self._run_batch(batch[middle:])
            return
        except ModelFailedError:
            raise  # the consumer dies; `_consumer_exited` fails everything pending
        except Exception as exc:
            log.exception("%s: batch of %d items failed", self.name, len(batch), exc_info=exc)
            for work in batch:
                # Details stay in the log: exception texts can carry paths.
                work.request.fail(ModelError(f"the {self.name} model failed on this request"))
            return
        self._report(batch, loop.time() - started)
        for work, output in zip(batch, outputs, strict=True):
            request = work.request
            request.outputs[work.index] = output
            request.remaining -= 1
            if request.remaining == 0 and not request.future.done():
                request.future.set_result(request.outputs)

    def _report(self, batch: list[_Work[Item]], seconds: float) -> None:
        if not self.on_batch:
            return
        stats = BatchStats(
            engine=self.name,
            items=len(batch),
            requests=len({id(work.request) for work in batch}),
            tokens=sum(work.length for work in batch),
            padded_tokens=len(batch) * max(work.length for work in batch),
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
