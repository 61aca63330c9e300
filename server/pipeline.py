"""The search pipeline: embed the query (dense and BM25), retrieve (dense, sparse or hybrid),
rerank. Models run through the core's `Inference`; store work runs on threads of its own, so the
event loop never blocks on Qdrant."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, TypeVar

from ragrank.blend import reranked_order
from ragrank.errors import (
    EngineUnavailableError,
    InvalidRequestError,
    ItemTooLargeError,
    ModelError,
    QueueFullError,
    RequestTimeoutError,
)
from ragrank.inference import Cascade, CascadeStage
from ragrank.settings import env_name
from ragrank.store import Fusion
from server.metrics import RERANK_FALLBACKS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ragrank.documents import Candidate, MetadataValue
    from ragrank.inference import Inference
    from ragrank.settings import Settings
    from ragrank.sparse import SparseQuery
    from server.services import Services

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

#: Searches in flight at once against a Qdrant server.
SERVER_STORE_THREADS = 8


@dataclass(frozen=True)
class ScoredHit:
    candidate: Candidate
    score: float
    #: 1-based position in the first stage's order, before any reranking.
    retrieval_rank: int
    #: The words of the hit's text that BM25 matched, when asked for.
    matched: tuple[str, ...] | None = None


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
    #: Each reranker that ran, in order (two for a cascade), with the pairs it scored.
    rerank_stages: tuple[CascadeStage, ...] = ()


class SearchPipeline:
    """Searches against one set of `Services`: the models through their `Inference`, the store
    on threads of its own. Close it with `close`."""

    def __init__(self, services: Services, settings: Settings) -> None:
        self.services = services
        self.inference: Inference = services.inference
        self._retrieval = settings.retrieval
        self._fusion = Fusion.from_settings(settings)
        self._blend = settings.rerank_blend
        # A server answers concurrent searches in parallel; the embedded engine holds the
        # interpreter lock for each call, so more than one thread would only contend for it.
        self._store_thread = ThreadPoolExecutor(
            1 if services.store.embedded else SERVER_STORE_THREADS,
            thread_name_prefix="ragrank-store",
        )

    def close(self) -> None:
        self._store_thread.shutdown(wait=True, cancel_futures=True)

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
        cascade: Cascade | Literal[False] | None = None,
        blend: float | None = None,
        min_score: float | None = None,
    ) -> SearchOutcome:
        """`retrieval`, `fusion`, `rrf_k` and the two weights default to the settings.
        `rerank="auto"` reranks when the reranker can, and otherwise returns first-stage order
        and says why (`rerank_error`) instead of failing the request. `language` names the
        query's language for BM25 (else it is identified); `highlight` lists each hit's words
        that BM25 matched; `model` names the reranker (the collection's embedder embeds).
        `cascade` reranks as a cascade (absent: the server's RAGRANK_CASCADE; False: none);
        `blend` is the first stage's weight in the reranked order (absent: the server's
        RAGRANK_RERANK_BLEND); `min_score` drops the hits whose score is below it."""
        reranker = self.inference.reranking(model).name  # an unknown name: a 400, before work
        rule = self.inference.cascade_rule if cascade is None else cascade or None
        if cascade and (problem := self.inference.cascade_problem(cascade)):
            raise InvalidRequestError(f"cascade.model: {problem}", field="cascade.model")
        retrieval = retrieval or self._retrieval
        fusing = self._fusion.override(
            method=fusion, k=rrf_k, dense_weight=dense_weight, sparse_weight=sparse_weight
        )
        with self.inference.request():
            return await self._search(
                query,
                top_k=top_k,
                candidates=candidates,
                rerank=rerank,
                where=where,
                retrieval=retrieval,
                fusing=fusing,
                language=language,
                highlight=highlight,
                reranker=reranker,
                cascade=rule if rerank else None,
                blend=self._blend if blend is None else blend,
                min_score=min_score,
            )

    async def _search(
        self,
        query: str,
        *,
        top_k: int,
        candidates: int,
        rerank: bool | Literal["auto"],
        where: Mapping[str, MetadataValue] | None,
        retrieval: str,
        fusing: Fusion,
        language: str | None,
        highlight: bool,
        reranker: str,
        cascade: Cascade | None,
        blend: float,
        min_score: float | None,
    ) -> SearchOutcome:
        store = self.services.store
        started = time.perf_counter()
        vector = None
        if retrieval != "sparse":
            # The collection's embedder (the default) embeds every search.
            embedded_query = await self.inference.embed([query], as_queries=True)
            vector = embedded_query.vectors[0]
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
        hits, rerank_error, stages = await self._reranked(
            query, hits, rerank, reranker, cascade, blend=blend
        )
        if min_score is not None:
            hits = [hit for hit in hits if hit.score >= min_score]
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
            rerank_stages=stages,
            timings_ms={
                "embed": (embedded - started) * 1000,
                "sparse": (encoded - embedded) * 1000,
                "retrieve": (fetched - encoded) * 1000,
                "rerank": (finished - fetched) * 1000,
                "total": (finished - started) * 1000,
            },
        )

    async def _reranked(
        self,
        query: str,
        hits: list[ScoredHit],
        rerank: bool | Literal["auto"],
        model: str,
        cascade: Cascade | None,
        *,
        blend: float,
    ) -> tuple[list[ScoredHit], str | None, tuple[CascadeStage, ...]]:
        """`hits` (in first-stage order) in the reranker's order, or in the cascade's, blended
        with theirs at the first stage's weight `blend` (`ragrank.blend`); or as they came
        with the reason when `rerank="auto"` and the reranker could not run; and the stages
        that ran."""
        if not (rerank and hits):
            return hits, None, ()
        passages = [h.candidate.chunk.passage for h in hits]
        started = time.perf_counter()
        stages: tuple[CascadeStage, ...]
        try:
            if cascade is not None:
                outcome = await self.inference.cascade(
                    query, passages, cascade, model=model, blend=blend
                )
                order, scores, stages = outcome.order, outcome.scores, outcome.stages
            else:
                reranked = await self.inference.rerank(query, passages, model=model)
                order = reranked_order(reranked.scores, blend)
                scores = [reranked.scores[i] for i in order]
                ms = (time.perf_counter() - started) * 1000
                stages = (CascadeStage(reranked.model, reranked.pairs, ms),)
        except RERANK_FAILURES as exc:
            if rerank != "auto":
                raise
            rerank_error = f"{exc.code}: {exc}"
            RERANK_FALLBACKS.labels(code=exc.code).inc()
            log.warning("reranking skipped, cosine order returned: %s", rerank_error)
            return hits, rerank_error, ()
        reordered = [
            ScoredHit(hits[i].candidate, float(score), hits[i].retrieval_rank)
            for i, score in zip(order, scores, strict=True)
        ]
        return reordered, None, stages

    async def _highlighted(self, hits: list[ScoredHit], query: SparseQuery) -> list[ScoredHit]:
        """Each hit with the words of its text that the query's BM25 terms match."""
        encoder = self.services.sparse
        assert encoder is not None

        def words(hit: ScoredHit) -> ScoredHit:
            chunk = hit.candidate.chunk
            language = encoder.language_of(chunk.passage, chunk.metadata)
            return replace(hit, matched=tuple(encoder.matches(query, chunk.text, language)))

        return list(await self.inference.on_host(lambda: [words(hit) for hit in hits]))

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
        return await self.inference.on_host(encoder.query, query, language)

    async def store_ready(self) -> bool:
        return await self._in_store_thread(self.services.store.ping)

    async def _in_store_thread(self, function: Callable[[], _Result]) -> _Result:
        return await asyncio.get_running_loop().run_in_executor(self._store_thread, function)
