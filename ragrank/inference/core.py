"""The one object that runs models: every served model's engine, and what the doors ask of
them (embed texts, rerank documents). The server's routes, the eval and the indexer call it;
none of them sees an engine or a backend (text-embeddings-inference's `Infer` plays this part).

Engines are made when it starts, in the event loop that starts it: the server's, or a loop
of its own on a thread (`running`), for callers without one (`ragrank index`, the worker, the
eval). Blocking callers on other threads (the indexer) reach it through `call`.

Two classes of work share each engine: interactive (requests) and bulk (indexing). A bulk
batch starts only while no engine on the same device has interactive work waiting or running,
so a query waits at most for the one bulk batch already on the device.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ragrank.calibration import Calibration, probabilities, read_calibration
from ragrank.cascade import Cascade, cascade_order, shortlist
from ragrank.device import batch_limits, resolve_placement
from ragrank.engine import (
    BatchEngine,
    DeviceLoad,
    DeviceTurns,
    EngineLimits,
    embedding_engine,
    scoring_engine,
)
from ragrank.errors import EngineUnavailableError, SettingsError
from ragrank.inference.served import Served, pick
from ragrank.inference.spec import role_spec
from ragrank.roles import EMBEDDING, RERANK
from ragrank.settings import env_name
from ragrank.tokens import WindowPlan

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator, Sequence

    from ragrank.engine import BatchStats
    from ragrank.protocols import Embedder, Scorer, Vectors
    from ragrank.settings import Batching, Settings
    from ragrank.tokens import ModelInput, TokenSpans

log = logging.getLogger(__name__)

Result = TypeVar("Result")
Vector = Any  # one row of `Vectors`

#: An offline run (the eval) waits as long as its scoring takes.
OFFLINE_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class RerankOutcome:
    #: One logit per document: its best window's.
    logits: list[float]
    #: Tokens the cross-encoder read, special tokens included.
    tokens: int
    #: The reranker that scored them (its model id).
    model: str = ""
    #: (query, window) pairs scored.
    pairs: int = 0
    #: One relevance score per document: the probability its model's calibration estimates
    #: from the logit, else the logit's sigmoid.
    scores: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class CascadeStage:
    """One reranker's part in a cascade."""

    model: str
    pairs: int
    ms: float


@dataclass(frozen=True)
class CascadeOutcome:
    """A cascade's answer: document indices best first, each one's relevance score (from the
    model that placed it), and each stage with the pairs it scored."""

    order: list[int]
    scores: list[float]
    #: Per position of `order`: placed by the large (default) model.
    second: list[bool]
    stages: tuple[CascadeStage, CascadeStage]
    tokens: int


@dataclass(frozen=True)
class EmbedOutcome:
    vectors: list[Vector]
    tokens: int
    #: The embedder that made them (its model id).
    model: str = ""


@dataclass(frozen=True)
class ModelPlacement:
    """Where a served model runs, as `/v1/models` shows it."""

    backend: str
    dtype: str
    device: str


def best_windows(plan: WindowPlan, window_logits: Sequence[float], documents: int) -> list[float]:
    """A long document is scored by its best window: the rule every door reranks by."""
    best = [-math.inf] * documents
    for owner, logit in zip(plan.owners, window_logits, strict=True):
        best[owner] = max(best[owner], logit)
    return best


def first_windows(plan: WindowPlan, per_document: int) -> WindowPlan:
    """The plan with each document's first `per_document` windows only."""
    seen: Counter[int] = Counter()
    kept = []
    for index, owner in enumerate(plan.owners):
        seen[owner] += 1
        if seen[owner] <= per_document:
            kept.append(index)
    return WindowPlan(
        inputs=[plan.inputs[i] for i in kept],
        owners=[plan.owners[i] for i in kept],
        query_tokens=plan.query_tokens,
    )


@dataclass
class _Options:
    """What every engine shares, read once from settings."""

    wait_ms: float
    queue_items: int
    timeout_s: float
    policy: Batching
    host_threads: int
    warm_up: bool
    strict_names: bool
    #: The share of a batch's token budget a bulk batch may take.
    bulk_share: float


class Inference:
    """Every served model, each with its engine; see the module docstring."""

    def __init__(
        self,
        embedders: Sequence[Served[Embedder]],
        rerankers: Sequence[Served[Scorer]],
        settings: Settings,
        *,
        offline: bool = False,
    ) -> None:
        """`offline` (the eval): window batching, no queue bound, no timeout, no warm-up."""
        if not embedders:
            raise ValueError("an inference needs at least one embedder")
        self.embedders: tuple[Served[Embedder], ...] = tuple(embedders)
        self.rerankers: tuple[Served[Scorer], ...] = tuple(rerankers)
        self._options = _Options(
            wait_ms=0.0 if offline else float(settings.batch_wait_ms),
            queue_items=2**62 if offline else settings.queue_size,
            timeout_s=OFFLINE_TIMEOUT_S if offline else float(settings.request_timeout_s),
            policy="window" if offline else settings.batching,
            host_threads=settings.host_threads,
            warm_up=settings.warmup == "on" and not offline,
            strict_names=settings.model_names == "strict",
            bulk_share=settings.bulk_batch_share,
        )
        #: The searches' cascade (RAGRANK_CASCADE), its filtering model checked to be served.
        self.cascade_rule = Cascade.parse(settings.cascade, env_name("cascade"))
        if self.cascade_rule is not None and self.rerankers:
            problem = self.cascade_problem(self.cascade_rule)
            if problem:
                raise SettingsError(f"{env_name('cascade')}: {problem}")
        self._placements = {
            id(served): resolve_placement(served.spec.device, served.spec.dtype)
            for served in self.served
        }
        #: Told of every batch of every engine (progress bars); may change while running.
        self.on_batch: list[Callable[[BatchStats], None]] = []
        self._engines: dict[int, BatchEngine[ModelInput, Any, Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._host_pool: ThreadPoolExecutor | None = None
        self._loads: dict[str, DeviceLoad] = {}

    @classmethod
    def of(
        cls,
        settings: Settings,
        *,
        embedders: Sequence[Embedder | Served[Embedder]],
        rerankers: Sequence[Scorer | Served[Scorer]] = (),
        offline: bool = False,
    ) -> Inference:
        """An inference over models loaded elsewhere (fakes in tests, a benchmark's model),
        each configured by the settings of its role unless it comes with its own spec."""

        def served(model: Any, role: Any) -> Served[Any]:
            if isinstance(model, Served):
                return model
            calibration = read_calibration(model.model_id) if role is RERANK else None
            return Served(role_spec(settings, role, model.model_id), model, calibration)

        return cls(
            [served(m, EMBEDDING) for m in embedders],
            [served(m, RERANK) for m in rerankers],
            settings,
            offline=offline,
        )

    # The served models.

    @property
    def served(self) -> list[Served[Any]]:
        """Every served model: the embedders, then the rerankers."""
        return [*self.embedders, *self.rerankers]

    @property
    def embedder(self) -> Embedder:
        """The default embedder: it indexes the collection and embeds every search."""
        return self.embedders[0].model

    @property
    def scorer(self) -> Scorer | None:
        """The default reranker, if any is served."""
        return self.rerankers[0].model if self.rerankers else None

    def embedding(self, name: str | None) -> Served[Embedder]:
        """The embedder a request's `model` picks (`pick`)."""
        return pick(self.embedders, name, strict=self._options.strict_names)

    def reranking(self, name: str | None) -> Served[Scorer]:
        """The reranker a request's `model` picks (`pick`)."""
        if not self.rerankers:
            raise EngineUnavailableError("no reranker is served")
        return pick(self.rerankers, name, strict=self._options.strict_names)

    def placement(self, served: Served[Any]) -> ModelPlacement:
        placement = self._placements[id(served)]
        return ModelPlacement(
            backend=str(getattr(served.model, "backend", "torch")),
            dtype=str(placement.dtype).removeprefix("torch."),
            device=placement.device,
        )

    def limits(self, served: Served[Any]) -> EngineLimits:
        """The batch limits and queueing of `served`'s engine."""
        spec, options = served.spec, self._options
        items, tokens = batch_limits(
            self._placements[id(served)], spec.max_batch_size, spec.max_batch_tokens
        )
        return EngineLimits(
            max_batch_size=items,
            max_batch_tokens=tokens,
            max_wait_ms=options.wait_ms,
            max_queue_items=options.queue_items,
            timeout_s=options.timeout_s,
            policy=options.policy,
            packed=bool(getattr(served.model, "packed", False)),
            max_bulk_tokens=max(1, int(tokens * options.bulk_share)),
        )

    # Life cycle.

    @property
    def engines(self) -> list[BatchEngine[ModelInput, Any, Any]]:
        """Every engine, once started."""
        return list(self._engines.values())

    def engine(self, served: Served[Any]) -> BatchEngine[ModelInput, Any, Any]:
        try:
            return self._engines[id(served)]
        except KeyError:
            message = f"the {served.spec.role.engine} engine is not running"
            raise EngineUnavailableError(message) from None

    async def start(self) -> None:
        """Warm the models up (when set), then start one engine per model in this loop."""
        if self._loop is not None:
            raise RuntimeError("this inference is already running")
        self._loop = asyncio.get_running_loop()
        # One pool for the host work of every model: tokenising, planning.
        self._host_pool = ThreadPoolExecutor(
            self._options.host_threads, thread_name_prefix="ragrank-host"
        )
        if self._options.warm_up:
            await asyncio.to_thread(self.warm_up)
        # The models of one role take turns on the device, in the order their batches asked,
        # so that a model with a long queue never holds it while another's batch waits.
        turns: dict[str, DeviceTurns] = {EMBEDDING.name: DeviceTurns(), RERANK.name: DeviceTurns()}
        # Every engine on one device knows of the others' requests: bulk work of any of them
        # waits until none is waiting or running.
        self._loads = {placement.device: DeviceLoad() for placement in self._placements.values()}
        loads = self._loads
        for embedder in self.embedders:
            self._add(embedder, embedding_engine, turns, loads)
        for reranker in self.rerankers:
            self._add(reranker, scoring_engine, turns, loads)
        for engine in self.engines:
            engine.start()

    def _add(
        self,
        served: Served[Any],
        make: Any,
        turns: dict[str, DeviceTurns],
        loads: dict[str, DeviceLoad],
    ) -> None:
        role = served.spec.role
        engine: BatchEngine[ModelInput, Any, Any] = make(
            role.engine,
            served.model,
            self.limits(served),
            pool=self._host_pool,
            model=served.name,
            turns=turns[role.name],
            load=loads[self._placements[id(served)].device],
        )
        engine.on_batch.append(self._tell)
        self._engines[id(served)] = engine

    def _tell(self, stats: BatchStats) -> None:
        for hook in list(self.on_batch):
            hook(stats)

    async def stop(self) -> None:
        """Finish queued work, stop the engines and the host pool."""
        for engine in self.engines:
            await engine.stop()
        self._engines.clear()
        if self._host_pool is not None:
            self._host_pool.shutdown(wait=False, cancel_futures=True)
        self._host_pool, self._loop = None, None

    async def __aenter__(self) -> Inference:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    @contextmanager
    def running(self) -> Iterator[Inference]:
        """Started on an event loop of its own, on a thread, for callers that have none;
        stopped on exit. Already running (in the server), it is left as it is."""
        if self._loop is not None:
            yield self
            return
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="ragrank-inference", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result()
            try:
                yield self
            finally:
                asyncio.run_coroutine_threadsafe(self.stop(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def call(self, work: Coroutine[Any, Any, Result]) -> Result:
        """Run `work` on the inference's loop and wait for it: for threads other than the
        loop's own (the indexer, the eval)."""
        loop = self._loop
        if loop is None:
            work.close()
            raise EngineUnavailableError("the inference is not running")
        if _running_loop() is loop:
            work.close()
            raise RuntimeError("Inference.call blocks: await the coroutine on the loop instead")
        return asyncio.run_coroutine_threadsafe(work, loop).result()

    @contextmanager
    def request(self) -> Iterator[None]:
        """Around a request that runs several models in turn (a search): bulk work stays off
        every device until it is answered."""
        with ExitStack() as stack:
            for load in self._loads.values():
                stack.enter_context(load.session())
            yield

    @property
    def models_ready(self) -> bool:
        return bool(self._engines) and all(engine.ready for engine in self.engines)

    async def on_host(self, function: Callable[..., Result], *args: Any) -> Result:
        """`function(*args)` on the host pool (tokenising work that is not a model's)."""
        return await asyncio.get_running_loop().run_in_executor(self._host_pool, function, *args)

    def warm_up(self) -> dict[str, float]:
        """Before readiness: each host thread makes its own tokenizer copies (seconds for a
        250k-piece vocabulary), and each served model runs its forward over representative
        shapes, so that a GPU's first request pays no CUDA start (context, kernels,
        allocator). Seconds by step."""
        started = time.perf_counter()
        self._warm_host_threads()
        spent = {"host threads": time.perf_counter() - started}
        for served in self.served:
            label = f"{served.spec.role.engine} {served.name}"
            limits = self.limits(served)
            started = time.perf_counter()
            passes = served.model.warm_up(limits.max_batch_size, limits.max_batch_tokens)
            spent[label] = time.perf_counter() - started
            log.info("warm-up: %s, %d forward passes in %.2f s", label, passes, spent[label])
        return spent

    def _warm_host_threads(self) -> None:
        """Tokenise once on every host thread: the barrier holds each thread until all have
        taken one task, so no thread takes two."""
        assert self._host_pool is not None
        threads = self._options.host_threads
        barrier = threading.Barrier(threads)

        def tokenise() -> None:
            for embedder in self.embedders:
                embedder.model.encode_texts(["warm up"])
            for scorer in self.rerankers:
                scorer.model.plan_windows("warm up", ["warm up"])
            barrier.wait(timeout=120)

        for done in [self._host_pool.submit(tokenise) for _ in range(threads)]:
            done.result()

    # What the doors ask.

    async def embed(
        self,
        texts: Sequence[str],
        *,
        as_queries: bool,
        model: str | None = None,
        bulk: bool = False,
    ) -> EmbedOutcome:
        """Embed texts with the query or passage prefix of the embedder `model` names (absent:
        the default), counting the tokens embedded. `bulk` work (indexing) yields to requests."""
        served = self.embedding(model)
        embedder, engine = served.model, self.engine(served)
        prefix = embedder.query_prefix if as_queries else embedder.passage_prefix
        inputs = await engine.prepare(embedder.encode_texts, [prefix + text for text in texts])
        vectors = await engine.submit(inputs, bulk=bulk)
        return EmbedOutcome(
            vectors=vectors, tokens=sum(len(item) for item in inputs), model=embedder.model_id
        )

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        max_tokens_per_doc: int | None = None,
        max_windows_per_doc: int | None = None,
        *,
        model: str | None = None,
    ) -> RerankOutcome:
        """Score each document against the query with the reranker `model` names (absent: the
        default); a long one is split into windows (its first `max_windows_per_doc` when
        given) and takes its best window's logit."""
        served = self.reranking(model)
        engine = self.engine(served)
        plan = await engine.prepare(served.model.plan_windows, query, documents, max_tokens_per_doc)
        if max_windows_per_doc is not None:
            plan = first_windows(plan, max_windows_per_doc)
        window_logits = await engine.submit(plan.inputs)
        return self._outcome(served, plan, window_logits, len(documents))

    async def rerank_all(
        self, requests: Sequence[tuple[str, Sequence[str]]], *, model: str | None = None
    ) -> list[RerankOutcome]:
        """`rerank` of many queries at once: every plan is made first and all windows are
        queued together, so the engine batches across queries (the eval's whole run)."""
        served = self.reranking(model)
        engine = self.engine(served)
        plans = await asyncio.gather(
            *(engine.prepare(served.model.plan_windows, q, docs) for q, docs in requests)
        )
        scored = await asyncio.gather(*(engine.submit(plan.inputs) for plan in plans))
        return [
            self._outcome(served, plan, logits, len(docs))
            for plan, logits, (_, docs) in zip(plans, scored, requests, strict=True)
        ]

    def calibration(self, model: str | None = None) -> Calibration | None:
        """The calibration of the reranker `model` names (absent: the default), if any."""
        return self.reranking(model).calibration

    def cascade_problem(self, cascade: Cascade) -> str | None:
        """Why a cascade cannot run here (its filtering model is not a served reranker),
        naming the served ones; None when it can."""
        names = [name for served in self.rerankers for name in served.names]
        if cascade.model in names:
            return None
        return (
            f"the cascade's model {cascade.model!r} is not a served reranker; the rerankers "
            f"are: {', '.join(names) or 'none'}"
        )

    async def cascade(
        self,
        query: str,
        documents: Sequence[str],
        cascade: Cascade,
        *,
        model: str | None = None,
        blend: float = 0.0,
    ) -> CascadeOutcome:
        """The cascade: `cascade.model` scores every document, and the reranker `model` names
        (absent: the default) rescores its top `cascade.top` (`ragrank.cascade`); `blend`
        mixes the documents' order (the first stage's) into both stages' orders."""
        first_model, second_model = self.reranking(cascade.model), self.reranking(model)
        started = time.perf_counter()
        first = await self.rerank(query, documents, model=first_model.name)
        filtered = time.perf_counter()
        short = shortlist(first.logits, cascade.top, blend)
        second = await self.rerank(query, [documents[i] for i in short], model=second_model.name)
        finished = time.perf_counter()
        merged = cascade_order(first.scores, short, second.scores, blend)
        return CascadeOutcome(
            order=merged.order,
            scores=merged.scores,
            second=merged.second,
            stages=(
                CascadeStage(first.model, first.pairs, (filtered - started) * 1000),
                CascadeStage(second.model, second.pairs, (finished - filtered) * 1000),
            ),
            tokens=first.tokens + second.tokens,
        )

    @staticmethod
    def _outcome(
        served: Served[Scorer], plan: WindowPlan, logits: Sequence[float], documents: int
    ) -> RerankOutcome:
        best = best_windows(plan, logits, documents)
        return RerankOutcome(
            logits=best,
            tokens=plan.tokens,
            model=served.model.model_id,
            pairs=len(plan.inputs),
            scores=probabilities(best, served.calibration).tolist(),
        )

    def bulk_embedder(self, model: str | None = None) -> EngineEmbedder:
        """The embedder `model` names (absent: the default) as blocking calls through its
        engine, as bulk work: what the indexer and the eval embed with."""
        return EngineEmbedder(self, self.embedding(model))


@dataclass
class EngineEmbedder:
    """An embedder whose vectors come through the inference's engine as bulk work, for
    callers on threads of their own (the indexer, the eval). It answers what they read of a
    model: its id, shape, prefixes, backend and token spans."""

    inference: Inference
    served: Served[Embedder]
    model_id: str = field(init=False)
    dimension: int = field(init=False)
    max_length: int = field(init=False)
    query_prefix: str = field(init=False)
    passage_prefix: str = field(init=False)
    backend: str = field(init=False)

    def __post_init__(self) -> None:
        model = self.served.model
        self.model_id, self.dimension = model.model_id, model.dimension
        self.max_length, self.backend = model.max_length, model.backend
        self.query_prefix, self.passage_prefix = model.query_prefix, model.passage_prefix

    def token_spans(self, text: str) -> TokenSpans:
        return self.served.model.token_spans(text)

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        return self._embed(texts, as_queries=True)

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        return self._embed(texts, as_queries=False)

    def _embed(self, texts: Sequence[str], *, as_queries: bool) -> Vectors:
        """Tokenised here, on the caller's thread, so that bulk work never queues on the host
        pool ahead of a request's tokenising; then embedded as bulk batches."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self.served.model
        prefix = model.query_prefix if as_queries else model.passage_prefix
        inputs = model.encode_texts([prefix + text for text in texts])
        engine = self.inference.engine(self.served)
        vectors = self.inference.call(engine.submit(inputs, bulk=True))
        return np.asarray(np.stack(vectors), dtype=np.float32)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
