"""The search pipeline: embed the query (dense and BM25), retrieve (dense, sparse or hybrid),
rerank. Model and store work runs in dedicated threads so the event loop never blocks on torch
or Qdrant."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from ragrank.device import batch_limits, resolve_placement
from ragrank.engine import (
    BatchEngine,
    DeviceTurns,
    EngineLimits,
    embedding_engine,
    scoring_engine,
)
from ragrank.errors import (
    EngineUnavailableError,
    InvalidRequestError,
    ItemTooLargeError,
    ModelError,
    QueueFullError,
    RequestTimeoutError,
)
from ragrank.memory import ModelSize, available_bytes, check_fits, weights_bytes
from ragrank.protocols import Embedder, ModelRole, Scorer, relevance
from ragrank.settings import ANY_NAME, Settings, env_name, first_name
from ragrank.sparse import SparseEncoder, SparseQuery, sparse_encoder
from ragrank.store import Fusion, Store, open_store
from ragrank.store.maintenance import indexed_sparse_encoder
from ragrank.tokens import WindowPlan
from server.metrics import RERANK_FALLBACKS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ragrank.documents import Candidate, MetadataValue
    from ragrank.tokens import ModelInput

log = logging.getLogger(__name__)

#: What `rerank="auto"` answers with cosine order instead of an error: the reranker is full,
#: dead, too slow, or failed on this input.
RERANK_FAILURES = (
    QueueFullError,
    EngineUnavailableError,
    RequestTimeoutError,
    ItemTooLargeError,
    ModelError,
)

_Result = TypeVar("_Result")
Vector = NDArray[np.float32]


#: Searches in flight at once against a Qdrant server.
SERVER_STORE_THREADS = 8


_Model = TypeVar("_Model")
EmbedEngine = BatchEngine["ModelInput", Any, Vector]
ScoreEngine = BatchEngine["ModelInput", Any, float]


@dataclass(frozen=True)
class Served(Generic[_Model]):
    """A loaded model with the names a request's `model` picks it by."""

    names: tuple[str, ...]
    model: _Model

    @property
    def name(self) -> str:
        """Its first name: what `/v1/models`, `/ready` and the metrics call it."""
        return first_name(self.names)


def pick(
    served: Sequence[Served[_Model]], name: str | None, role: ModelRole, *, strict: bool
) -> Served[_Model]:
    """The served model a request names. Absent, or a name no model answers to: the one named
    `*` if any, else the default (the first), so that clients sending a vendor's name work
    unchanged. `strict` makes an unknown name a 400 listing the served ones instead."""
    if name is None:
        return served[0]
    for candidate in served:
        if name in candidate.names:
            return candidate
    for candidate in served:
        if ANY_NAME in candidate.names:
            return candidate
    if not strict:
        return served[0]
    listed = "; ".join(" | ".join(s.names) for s in served)
    raise InvalidRequestError(
        f"model: {name!r} is not served here; the {role} models are: {listed} (see /v1/models,"
        f" or set {env_name('model_names')}=open to answer any name with the default)",
        field="model",
    )


@dataclass(frozen=True)
class Services:
    """What the server needs from the core, built once and handed to `create_app`."""

    #: The default embedder: it indexes the collection and embeds every search.
    embedder: Embedder
    #: The default reranker: what a request that names no model gets.
    scorer: Scorer
    store: Store
    #: Makes BM25 vectors; None when the collection holds dense vectors only.
    sparse: SparseEncoder | None = None
    #: Every served reranker, the default first; empty means `scorer` alone, by its model id.
    rerankers: tuple[Served[Scorer], ...] = ()
    #: Every served embedder, the default first; empty means `embedder` alone.
    embedders: tuple[Served[Embedder], ...] = ()

    def __post_init__(self) -> None:
        # A default alone is served by its model id; `dataclasses.replace` of the default
        # (as tests swap a model) serves the new one alone.
        for field, default in (("rerankers", self.scorer), ("embedders", self.embedder)):
            served: tuple[Served[Any], ...] = getattr(self, field)
            alone = len(served) == 1 and served[0].names == (served[0].model.model_id,)
            if not served or (alone and served[0].model is not default):
                object.__setattr__(self, field, (Served((default.model_id,), default),))
            elif served[0].model is not default:
                raise ValueError(f"the first of {field} must be the default model")

    @classmethod
    def load(cls, settings: Settings) -> Services:
        """Check that the served models fit the device, load them, and open the store; the
        collection is created if missing."""
        from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder

        placement = resolve_placement(settings.device, settings.dtype)
        dtype = str(placement.dtype).removeprefix("torch.")
        listed = (*settings.served_embedders, *settings.served_rerankers)
        check_fits(
            [ModelSize(s.name, weights_bytes(s.model_id, dtype)) for s in listed],
            device=placement.device,
            dtype=dtype,
            share=settings.model_memory_share,
            free=available_bytes(placement.device),
        )
        embedders = tuple(
            Served[Embedder](
                s.names, SentenceTransformerEmbedder.from_settings(settings, s.model_id)
            )
            for s in settings.served_embedders
        )
        rerankers = tuple(
            Served[Scorer](s.names, CrossEncoderScorer.from_settings(settings, s.model_id))
            for s in settings.served_rerankers
        )
        embedder = embedders[0].model
        sparse = sparse_encoder(settings)
        store = open_store(settings)
        try:
            store.ensure_collection(embedder.dimension)
            # A collection indexed in one fixed language answers in it until re-indexed.
            sparse = indexed_sparse_encoder(store, sparse)
            # An embedded store builds its index here, before the server answers anything:
            # the build stops every thread of the process (see ragrank/store/edge.py).
            store.optimize()
        except Exception:
            store.close()
            raise
        return cls(
            embedder=embedder,
            scorer=rerankers[0].model,
            store=store,
            sparse=sparse,
            rerankers=rerankers,
            embedders=embedders,
        )


@dataclass(frozen=True)
class ScoredHit:
    candidate: Candidate
    score: float
    #: 1-based position in the first stage's order, before any reranking.
    retrieval_rank: int
    #: The words of the hit's text that BM25 matched, when asked for.
    matched: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RerankOutcome:
    #: One logit per document: its best window's.
    logits: list[float]
    #: Tokens the cross-encoder read, special tokens included.
    tokens: int
    #: The reranker that scored them.
    model: str = ""


@dataclass(frozen=True)
class EmbedOutcome:
    vectors: list[Vector]
    tokens: int
    #: The embedder that made them.
    model: str = ""


@dataclass(frozen=True)
class SearchOutcome:
    hits: list[ScoredHit]
    reranked: bool
    timings_ms: dict[str, float]
    #: The first stage that ran: dense, sparse or hybrid.
    retrieval: str = "dense"
    #: Why the hits are in first-stage order though `rerank="auto"` asked for reranking.
    rerank_error: str | None = None
    #: The language(s) the query's BM25 terms were analysed in, when they were.
    sparse_language: str | None = None


class SearchService:
    """Runs searches against one set of `Services`: one batching engine per model, shared by
    all requests, and a thread for the store. Use it as an async context manager."""

    def __init__(self, services: Services, settings: Settings) -> None:
        self.services = services
        self._warmup = settings.warmup == "on"
        self._strict_names = settings.model_names == "strict"
        self._retrieval = settings.retrieval
        self._fusion = Fusion(
            settings.fusion,
            settings.rrf_k,
            settings.rrf_dense_weight,
            settings.rrf_sparse_weight,
            settings.fusion_other_languages,
        )
        placement = resolve_placement(settings.device, settings.dtype)

        def limits(size: int, tokens: int, *, packed: bool) -> EngineLimits:
            items, budget = batch_limits(placement, size, tokens)
            return EngineLimits(
                max_batch_size=items,
                max_batch_tokens=budget,
                max_wait_ms=settings.batch_wait_ms,
                max_queue_items=settings.queue_size,
                timeout_s=settings.request_timeout_s,
                policy=settings.batching,
                packed=packed,
            )

        # One pool for all host work of every model: tokenising, planning, collating.
        self._host_threads = settings.host_threads
        self.host_pool = ThreadPoolExecutor(self._host_threads, thread_name_prefix="ragrank-host")
        # The rerankers take turns on the device, in the order their batches asked, so that a
        # model with a long queue never holds it while another's batch waits; so do the
        # embedders.
        embed_turns, rerank_turns = DeviceTurns(), DeviceTurns()

        def embed_engine(served: Served[Embedder]) -> EmbedEngine:
            return embedding_engine(
                "embed",
                served.model,
                limits(
                    settings.embed_batch_size,
                    settings.embed_batch_tokens,
                    packed=served.model.packed,
                ),
                pool=self.host_pool,
                model=served.name,
                turns=embed_turns,
            )

        def score_engine(served: Served[Scorer]) -> ScoreEngine:
            return scoring_engine(
                "rerank",
                served.model,
                limits(
                    settings.rerank_batch_size,
                    settings.rerank_batch_tokens,
                    packed=served.model.packed,
                ),
                pool=self.host_pool,
                model=served.name,
                turns=rerank_turns,
            )

        #: One batching engine per served model, by the model's name.
        self.embed_engines = {s.name: embed_engine(s) for s in services.embedders}
        self.score_engines = {s.name: score_engine(s) for s in services.rerankers}
        self.embed_engine = self.embed_engines[services.embedders[0].name]
        self.score_engine = self.score_engines[services.rerankers[0].name]
        # A server answers concurrent searches in parallel; the embedded engine holds the
        # interpreter lock for each call, so more than one thread would only contend for it.
        self._store_thread = ThreadPoolExecutor(
            1 if services.store.embedded else SERVER_STORE_THREADS,
            thread_name_prefix="ragrank-store",
        )

    @property
    def engines(self) -> list[BatchEngine[ModelInput, Any, Any]]:
        return [*self.embed_engines.values(), *self.score_engines.values()]

    def reranker(
        self, name: str | None
    ) -> tuple[Served[Scorer], BatchEngine[ModelInput, Any, float]]:
        """The reranker a request's `model` picks (see `pick`), and its engine."""
        served = pick(self.services.rerankers, name, "rerank", strict=self._strict_names)
        return served, self.score_engines[served.name]

    def embedder(
        self, name: str | None
    ) -> tuple[Served[Embedder], BatchEngine[ModelInput, Any, Vector]]:
        """The embedder a request's `model` picks (see `pick`), and its engine."""
        served = pick(self.services.embedders, name, "embedding", strict=self._strict_names)
        return served, self.embed_engines[served.name]

    async def __aenter__(self) -> SearchService:
        if self._warmup:
            await asyncio.to_thread(self.warm_up)
        for engine in self.engines:
            engine.start()
        return self

    def warm_up(self) -> dict[str, float]:
        """Before readiness: each host thread makes its own tokenizer copies (seconds for a
        250k-piece vocabulary), and each served model runs its forward over representative
        shapes, so that a GPU's first request pays no CUDA start (context, kernels,
        allocator). Seconds by step."""
        started = time.perf_counter()
        self._warm_host_threads()
        spent = {"host threads": time.perf_counter() - started}
        served: list[tuple[str, Embedder | Scorer, BatchEngine[Any, Any, Any]]] = [
            *(
                ("embed " + s.name, s.model, self.embed_engines[s.name])
                for s in self.services.embedders
            ),
            *(
                ("rerank " + s.name, s.model, self.score_engines[s.name])
                for s in self.services.rerankers
            ),
        ]
        for label, model, engine in served:
            started = time.perf_counter()
            passes = model.warm_up(engine.limits.max_batch_size, engine.limits.max_batch_tokens)
            spent[label] = time.perf_counter() - started
            log.info("warm-up: %s, %d forward passes in %.2f s", label, passes, spent[label])
        return spent

    def _warm_host_threads(self) -> None:
        """Tokenise once on every host thread: the barrier holds each thread until all have
        taken one task, so no thread takes two."""
        barrier = threading.Barrier(self._host_threads)

        def tokenise() -> None:
            for embedder in self.services.embedders:
                embedder.model.encode_texts(["warm up"])
            for scorer in self.services.rerankers:
                scorer.model.plan_windows("warm up", ["warm up"])
            barrier.wait(timeout=120)

        for done in [self.host_pool.submit(tokenise) for _ in range(self._host_threads)]:
            done.result()

    async def __aexit__(self, *_: object) -> None:
        for engine in self.engines:
            await engine.stop()
        self.host_pool.shutdown(wait=False, cancel_futures=True)
        self._store_thread.shutdown(wait=True, cancel_futures=True)

    @property
    def models_ready(self) -> bool:
        return all(engine.ready for engine in self.engines)

    async def search(
        self,
        query: str,
        *,
        top_k: int,
        candidates: int,
        rerank: bool | Literal["auto"],
        where: Mapping[str, MetadataValue] | None = None,
        retrieval: str | None = None,
        fusion: str | None = None,
        rrf_k: int | None = None,
        dense_weight: float | None = None,
        sparse_weight: float | None = None,
        language: str | None = None,
        highlight: bool = False,
        model: str | None = None,
    ) -> SearchOutcome:
        """`retrieval`, `fusion`, `rrf_k` and the two weights default to the settings.
        `rerank="auto"` reranks when the reranker can, and otherwise returns first-stage order
        and says why (`rerank_error`) instead of failing the request. `language` names the
        query's language for BM25 (else it is identified); `highlight` lists each hit's words
        that BM25 matched; `model` names the reranker (the collection's embedder embeds)."""
        reranker = self.reranker(model)[0].name  # an unknown name is a 400 before any work
        store = self.services.store
        retrieval = retrieval or self._retrieval
        fusing = Fusion(
            fusion or self._fusion.method,
            rrf_k or self._fusion.k,
            dense_weight or self._fusion.dense_weight,
            sparse_weight or self._fusion.sparse_weight,
            self._fusion.other_languages,
        )
        started = time.perf_counter()
        vector = None
        if retrieval != "sparse":
            embedder = self.services.embedder
            inputs = await self.embed_engine.prepare(
                embedder.encode_texts, [embedder.query_prefix + query]
            )
            vector = (await self.embed_engine.submit(inputs))[0]
        embedded = time.perf_counter()
        analysed = None
        if retrieval != "dense" or (highlight and self.services.sparse is not None):
            analysed = await self._sparse_query(query, retrieval, language)
        lexical = None if retrieval == "dense" or analysed is None else analysed.vector
        encoded = time.perf_counter()
        languages = self._fused_languages(analysed)
        retrieved = await self._in_store_thread(
            lambda: store.search(
                vector, candidates, where, sparse=lexical, fusion=fusing, languages=languages
            )
        )
        fetched = time.perf_counter()
        hits = [ScoredHit(c, c.retrieval_score, rank) for rank, c in enumerate(retrieved, 1)]
        hits, rerank_error = await self._reranked(query, hits, rerank, reranker)
        hits = hits[:top_k]
        if highlight and analysed is not None:
            hits = await self._highlighted(hits, analysed)
        finished = time.perf_counter()
        return SearchOutcome(
            hits=hits,
            reranked=bool(rerank) and rerank_error is None,
            retrieval=retrieval,
            rerank_error=rerank_error,
            sparse_language=None if analysed is None else analysed.language,
            timings_ms={
                "embed": (embedded - started) * 1000,
                "sparse": (encoded - embedded) * 1000,
                "retrieve": (fetched - encoded) * 1000,
                "rerank": (finished - fetched) * 1000,
                "total": (finished - started) * 1000,
            },
        )

    async def _reranked(
        self, query: str, hits: list[ScoredHit], rerank: bool | Literal["auto"], model: str
    ) -> tuple[list[ScoredHit], str | None]:
        """`hits` in the reranker's order, or as they came with the reason when `rerank="auto"`
        and the reranker could not run."""
        rerank_error = None
        if rerank and hits:
            try:
                passages = [h.candidate.chunk.passage for h in hits]
                reranked = await self.rerank(query, passages, model=model)
            except RERANK_FAILURES as exc:
                if rerank != "auto":
                    raise
                rerank_error = f"{exc.code}: {exc}"
                RERANK_FALLBACKS.labels(code=exc.code).inc()
                log.warning("reranking skipped, cosine order returned: %s", rerank_error)
            else:
                scores = relevance(np.asarray(reranked.logits, dtype=np.float32))
                hits = [
                    ScoredHit(hit.candidate, float(score), hit.retrieval_rank)
                    for hit, score in zip(hits, scores, strict=True)
                ]
                # A stable sort keeps cosine order among equal rerank scores.
                hits.sort(key=lambda hit: hit.score, reverse=True)
        return hits, rerank_error

    async def _highlighted(self, hits: list[ScoredHit], query: SparseQuery) -> list[ScoredHit]:
        """Each hit with the words of its text that the query's BM25 terms match."""
        encoder = self.services.sparse
        assert encoder is not None

        def words(hit: ScoredHit) -> ScoredHit:
            chunk = hit.candidate.chunk
            language = encoder.language_of(chunk.passage, chunk.metadata)
            return replace(hit, matched=tuple(encoder.matches(query, chunk.text, language)))

        loop = asyncio.get_running_loop()
        return list(
            await loop.run_in_executor(self.host_pool, lambda: [words(hit) for hit in hits])
        )

    def _fused_languages(self, analysed: SparseQuery | None) -> list[str]:
        """The languages the query's BM25 terms are in, when every chunk is stored with its
        own (BM25 `auto`): the fusion then knows which passages BM25 could not read."""
        encoder = self.services.sparse
        if analysed is None or not analysed.language or encoder is None or not encoder.detects:
            return []
        return analysed.language.split("+")

    async def _sparse_query(
        self, query: str, retrieval: str, language: str | None = None
    ) -> SparseQuery:
        """The query's BM25 vector, on a host thread (it tokenises)."""
        encoder = self.services.sparse
        if encoder is None:
            raise InvalidRequestError(
                f"retrieval={retrieval} needs BM25 sparse vectors, but this server keeps dense "
                f"vectors only ({env_name('sparse')}=none); use retrieval=dense",
                field="retrieval",
            )
        return await asyncio.get_running_loop().run_in_executor(
            self.host_pool, encoder.query, query, language
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
        served, engine = self.reranker(model)
        plan = await engine.prepare(served.model.plan_windows, query, documents, max_tokens_per_doc)
        if max_windows_per_doc is not None:
            plan = _first_windows(plan, max_windows_per_doc)
        window_logits = await engine.submit(plan.inputs)
        best = [-math.inf] * len(documents)
        for owner, logit in zip(plan.owners, window_logits, strict=True):
            best[owner] = max(best[owner], logit)
        return RerankOutcome(logits=best, tokens=plan.tokens, model=served.model.model_id)

    async def embed(
        self, texts: Sequence[str], *, as_queries: bool, model: str | None = None
    ) -> EmbedOutcome:
        """Embed texts with the query or passage prefix of the embedder `model` names (absent:
        the default), counting the tokens embedded."""
        served, engine = self.embedder(model)
        embedder = served.model
        prefix = embedder.query_prefix if as_queries else embedder.passage_prefix
        inputs = await engine.prepare(embedder.encode_texts, [prefix + text for text in texts])
        vectors = await engine.submit(inputs)
        return EmbedOutcome(
            vectors=vectors, tokens=sum(len(item) for item in inputs), model=embedder.model_id
        )

    async def store_ready(self) -> bool:
        return await self._in_store_thread(self.services.store.ping)

    async def _in_store_thread(self, function: Callable[[], _Result]) -> _Result:
        return await asyncio.get_running_loop().run_in_executor(self._store_thread, function)


def _first_windows(plan: WindowPlan, per_document: int) -> WindowPlan:
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
