"""The search pipeline: embed the query, retrieve by cosine, rerank. Model and store work runs in
dedicated threads so the event loop never blocks on torch or Qdrant."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from ragrank.documents import Candidate, MetadataValue
from ragrank.models import (
    CrossEncoderScorer,
    Embedder,
    Scorer,
    SentenceTransformerEmbedder,
    relevance,
)
from ragrank.settings import Settings
from ragrank.store import QdrantStore

_Result = TypeVar("_Result")


@dataclass(frozen=True)
class Services:
    """What the server needs from the core, built once and handed to `create_app`."""

    embedder: Embedder
    scorer: Scorer
    store: QdrantStore

    @classmethod
    def load(cls, settings: Settings) -> Services:
        """Load both models and open the store; the collection is created if missing."""
        embedder = SentenceTransformerEmbedder.from_settings(settings)
        scorer = CrossEncoderScorer.from_settings(settings)
        store = QdrantStore.from_settings(settings)
        try:
            store.ensure_collection(embedder.dimension)
        except Exception:
            store.close()
            raise
        return cls(embedder=embedder, scorer=scorer, store=store)


@dataclass(frozen=True)
class ScoredHit:
    candidate: Candidate
    score: float


@dataclass(frozen=True)
class SearchOutcome:
    hits: list[ScoredHit]
    reranked: bool
    timings_ms: dict[str, float]


class SearchService:
    """Runs searches against one set of `Services`. One thread per model keeps forward passes
    serial (the batching engine will share them across requests); the store gets its own."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._embed_thread = ThreadPoolExecutor(1, thread_name_prefix="ragrank-embed")
        self._score_thread = ThreadPoolExecutor(1, thread_name_prefix="ragrank-score")
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="ragrank-store")

    async def search(
        self,
        query: str,
        *,
        top_k: int,
        candidates: int,
        rerank: bool,
        where: Mapping[str, MetadataValue] | None = None,
    ) -> SearchOutcome:
        embedder, scorer, store = self.services.embedder, self.services.scorer, self.services.store
        started = time.perf_counter()
        vector = (await self._run(self._embed_thread, embedder.embed_queries, [query]))[0]
        embedded = time.perf_counter()
        retrieved = await self._run(
            self._store_thread, lambda: store.search(vector, candidates, where)
        )
        fetched = time.perf_counter()
        if rerank and retrieved:
            passages = [c.chunk.passage for c in retrieved]
            logits = await self._run(self._score_thread, scorer.score, query, passages)
            scores = relevance(logits)
            hits = [ScoredHit(c, float(s)) for c, s in zip(retrieved, scores, strict=True)]
            # A stable sort keeps cosine order among equal rerank scores.
            hits.sort(key=lambda hit: hit.score, reverse=True)
        else:
            hits = [ScoredHit(c, c.retrieval_score) for c in retrieved]
        finished = time.perf_counter()
        return SearchOutcome(
            hits=hits[:top_k],
            reranked=rerank,
            timings_ms={
                "embed": (embedded - started) * 1000,
                "retrieve": (fetched - embedded) * 1000,
                "rerank": (finished - fetched) * 1000,
                "total": (finished - started) * 1000,
            },
        )

    async def store_ready(self) -> bool:
        return await self._run(self._store_thread, self.services.store.ping)

    def close(self) -> None:
        for pool in (self._embed_thread, self._score_thread, self._store_thread):
            pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    async def _run(
        pool: ThreadPoolExecutor, function: Callable[..., _Result], *args: object
    ) -> _Result:
        return await asyncio.get_running_loop().run_in_executor(pool, function, *args)
