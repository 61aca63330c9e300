"""`ragrank eval`: NDCG@10 and friends of cosine-only, reranked and ANN retrieval on
BEIR-format collections, with paired significance tests and per-query wins and losses."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from eval.beir import BeirDataset, load_beir
from eval.embedding_cache import EmbeddingCache, cache_key
from eval.exact import ExactIndex
from eval.metrics import Comparison, SystemScores, compare, score_run
from eval.runs import (
    ann_run,
    exact_run,
    index_for_ann,
    overlap_recall,
    rerank_run,
)
from ragrank.errors import DocumentError, SettingsError
from ragrank.models import Embedder, Scorer, Vectors
from ragrank.store import Store

log = logging.getLogger(__name__)

SYSTEMS = ("cosine", "reranked", "ann")
#: The first stage of `--baseline-embed-model`: the model the evaluated embedder is compared
#: against (e.g. the one it was fine-tuned from).
BASELINE_COSINE = "cosine-baseline"
#: Depth of the first-stage run: Recall@100 and MAP@100 need 100 documents.
TOP_K = 100

#: Opens the Qdrant collection for one dataset's ANN run; the argument is a cache key that
#: names the embeddings, so a server collection can be reused by a later run.
StoreFactory = Callable[[str, str], AbstractContextManager[Store]]


@dataclass(frozen=True)
class EvalOptions:
    systems: tuple[str, ...] = SYSTEMS
    split: str = "test"
    #: How many of the cosine top documents the cross-encoder reranks.
    candidates: int = 100
    limit_queries: int | None = None
    #: Where corpus embeddings are cached; None turns the cache off.
    cache_dir: Path | None = None
    rerank_batch_size: int = 16
    rerank_batch_tokens: int = 8_192
    encode_batch: int = 256
    progress: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown:
            raise SettingsError(
                f"--systems: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SYSTEMS)}"
            )
        if not 1 <= self.candidates <= TOP_K:
            raise SettingsError(f"--candidates must be between 1 and {TOP_K}")
        if self.limit_queries is not None and self.limit_queries < 1:
            raise SettingsError("--limit-queries must be at least 1")


@dataclass
class DatasetResult:
    """Everything measured on one collection."""

    name: str
    path: str
    split: str
    checksums: Mapping[str, str]
    documents: int
    judged_queries: int
    queries: dict[str, str]
    scores: dict[str, SystemScores] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    #: Overlap of Qdrant's top-k with the exact top-k, by k.
    ann_recall: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


def evaluate_dataset(
    path: Path,
    embedder: Embedder,
    scorer: Scorer | None,
    options: EvalOptions,
    open_store: StoreFactory | None = None,
    *,
    baseline_embedder: Embedder | None = None,
) -> DatasetResult:
    """Run the chosen systems on one BEIR collection. Cosine is always run: it is the first
    stage of the reranker, the baseline of every comparison and the reference of ANN recall.
    With `baseline_embedder`, its exact cosine run (`cosine-baseline`) is the baseline that
    cosine itself is compared against."""
    dataset = load_beir(path, split=options.split)
    queries = _evaluated_queries(dataset, options.limit_queries)
    qrels = {qid: dataset.qrels[qid] for qid in queries}
    doc_ids = list(dataset.corpus)
    passages = {doc_id: doc.passage for doc_id, doc in dataset.corpus.items()}
    result = DatasetResult(
        name=dataset.name,
        path=str(path),
        split=options.split,
        checksums=dataset.checksums,
        documents=len(doc_ids),
        judged_queries=len(dataset.judged_queries),
        queries=queries,
    )
    timings = result.timings
    key = corpus_key(embedder, dataset)
    start = time.perf_counter()
    vectors, cached = corpus_vectors(
        embedder, doc_ids, [passages[d] for d in doc_ids], key, options
    )
    timings["corpus_encode_s"] = time.perf_counter() - start
    timings["corpus_cached"] = float(cached)

    start = time.perf_counter()
    query_vectors = embedder.embed_queries(list(queries.values()))
    timings["embed_ms_per_query"] = _per_query_ms(start, len(queries))

    index = ExactIndex(vectors)
    start = time.perf_counter()
    runs = {"cosine": exact_run(index, list(queries), query_vectors, doc_ids, TOP_K)}
    timings["retrieval_ms_per_query"] = _per_query_ms(start, len(queries))
    timings["faiss_gpu"] = float(index.gpu)
    if baseline_embedder is not None:
        baseline_vectors, _ = corpus_vectors(
            baseline_embedder,
            doc_ids,
            [passages[d] for d in doc_ids],
            corpus_key(baseline_embedder, dataset),
            options,
        )
        runs[BASELINE_COSINE] = exact_run(
            ExactIndex(baseline_vectors),
            list(queries),
            baseline_embedder.embed_queries(list(queries.values())),
            doc_ids,
            TOP_K,
        )

    if "reranked" in options.systems:
        if scorer is None:
            raise ValueError("the reranked system needs a reranking model")
        start = time.perf_counter()
        runs["reranked"], pairs = rerank_run(
            scorer,
            queries,
            runs["cosine"],
            passages,
            candidates=options.candidates,
            batch_size=options.rerank_batch_size,
            batch_tokens=options.rerank_batch_tokens,
            progress=options.progress,
        )
        timings["rerank_ms_per_query"] = _per_query_ms(start, len(queries))
        timings["rerank_pairs_per_s"] = pairs / max(time.perf_counter() - start, 1e-9)

    if "ann" in options.systems:
        if open_store is None:
            raise ValueError("the ann system needs a Qdrant store")
        with open_store(dataset.name, key) as store:
            index_for_ann(store, list(dataset.corpus.values()), vectors, progress=options.progress)
            start = time.perf_counter()
            runs["ann"] = ann_run(store, list(queries), query_vectors, TOP_K)
            timings["ann_ms_per_query"] = _per_query_ms(start, len(queries))
        result.ann_recall = {
            f"recall@{k}": overlap_recall(runs["ann"], runs["cosine"], k) for k in (10, TOP_K)
        }

    result.scores = {name: score_run(qrels, run, name) for name, run in runs.items()}
    result.comparisons = compare(
        qrels,
        {name: run for name, run in runs.items() if name != BASELINE_COSINE},
        result.scores,
        baseline="cosine",
    )
    if BASELINE_COSINE in runs:
        result.comparisons += compare(
            qrels,
            {BASELINE_COSINE: runs[BASELINE_COSINE], "cosine": runs["cosine"]},
            result.scores,
            baseline=BASELINE_COSINE,
        )
    return result


def corpus_key(embedder: Embedder, dataset: BeirDataset) -> str:
    """The embedding-cache key of `dataset`'s corpus as `embedder` encodes it."""
    corpus_file = next(name for name in dataset.checksums if name.startswith("corpus"))
    return cache_key(
        model_id=embedder.model_id,
        passage_prefix=embedder.passage_prefix,
        corpus_checksum=dataset.checksums[corpus_file],
        max_length=embedder.max_length,
    )


def evaluate_datasets(
    paths: Sequence[Path],
    embedder: Embedder,
    scorer: Scorer | None,
    options: EvalOptions,
    open_store: StoreFactory | None = None,
    *,
    baseline_embedder: Embedder | None = None,
) -> Iterator[DatasetResult]:
    for path in paths:
        log.info("evaluating %s", path)
        yield evaluate_dataset(
            path, embedder, scorer, options, open_store, baseline_embedder=baseline_embedder
        )


def _evaluated_queries(dataset: BeirDataset, limit: int | None) -> dict[str, str]:
    """The judged queries in file order, the first `limit` of them when limited."""
    judged = dataset.judged_queries
    missing = len(dataset.qrels) - len(judged)
    if missing:
        log.warning("%s: %d judged query ids are not in queries.jsonl", dataset.name, missing)
    if not judged:
        raise DocumentError(f"{dataset.name}: no query of queries.jsonl has relevance labels")
    return dict(list(judged.items())[:limit]) if limit else judged


def corpus_vectors(
    embedder: Embedder, doc_ids: list[str], texts: list[str], key: str, options: EvalOptions
) -> tuple[Vectors, bool]:
    """Corpus embeddings from the cache, else encoded (in length order, with a progress bar)
    and cached."""
    cache = EmbeddingCache(options.cache_dir) if options.cache_dir else None
    if cache is not None and (vectors := cache.load(key, doc_ids)) is not None:
        return vectors, True
    vectors = np.zeros((len(texts), embedder.dimension), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    step = options.encode_batch
    with tqdm(
        total=len(texts), desc="encoding corpus", unit="doc", disable=not options.progress
    ) as bar:
        for start in range(0, len(order), step):
            rows = order[start : start + step]
            vectors[rows] = embedder.embed_passages([texts[i] for i in rows])
            bar.update(len(rows))
    if cache is not None:
        cache.save(key, doc_ids, vectors)
    return vectors, False


def _per_query_ms(start: float, queries: int) -> float:
    return (time.perf_counter() - start) * 1000 / max(queries, 1)
