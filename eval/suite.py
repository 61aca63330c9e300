"""`ragrank eval`: NDCG@10 and friends of cosine-only, reranked, ANN, BM25 and hybrid
retrieval on BEIR-format collections, with paired significance tests, per-query wins and
losses, and each system's reranking headroom (oracle@K)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from eval.calibration import reliability
from eval.embedding_cache import EmbeddingCache, cache_key
from eval.exact import ExactIndex
from eval.metrics import Comparison, SystemScores, compare, oracle_ndcg, score_run
from eval.runs import exact_run, index_corpus, overlap_recall
from eval.splits import group_split
from eval.systems import BASELINE, TOP_K, System, SystemInputs, plan
from ragrank.beir import BeirDataset, load_beir, merge_beir
from ragrank.errors import DocumentError, SettingsError
from ragrank.store import Store

if TYPE_CHECKING:
    from pathlib import Path

    from eval.metrics import Run
    from eval.options import EvalOptions
    from ragrank.beir import Qrels
    from ragrank.protocols import Reranking, Vectors
    from ragrank.protocols import TextEmbedder as Embedder
    from ragrank.sparse import SparseEncoder

log = logging.getLogger(__name__)

#: The first stage of `--baseline-embed-model`: the model the evaluated embedder is compared
#: against (e.g. the one it was fine-tuned from).
BASELINE_COSINE = "cosine-baseline"
#: Opens the Qdrant collection for one dataset's ANN run; the argument is a cache key that
#: names the embeddings, so a server collection can be reused by a later run.
StoreFactory = Callable[[str, str], AbstractContextManager[Store]]


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
    #: Each system's oracle@K: NDCG@10 of the best reordering of its top K.
    oracle: dict[str, float] = field(default_factory=dict)
    oracle_k: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    #: How many queries BM25 analysed in each language (`+` joins two when unsure).
    sparse_query_languages: dict[str, int] = field(default_factory=dict)
    #: Each reranking system's reliability: ECE of its sigmoid and of its calibration.
    reliability: dict[str, dict[str, float]] = field(default_factory=dict)


def evaluate_dataset(
    path: Path,
    embedder: Embedder,
    reranker: Reranking | None,
    options: EvalOptions,
    open_store: StoreFactory | None = None,
    *,
    baseline_embedder: Embedder | None = None,
    sparse: SparseEncoder | None = None,
) -> DatasetResult:
    """Run the chosen systems on one BEIR collection (see `evaluate_collection`)."""
    dataset = load_beir(path, split=options.split)
    (result,) = evaluate_collection(
        dataset,
        str(path),
        embedder,
        reranker,
        options,
        open_store=open_store,
        baseline_embedder=baseline_embedder,
        sparse=sparse,
    )
    return result


def evaluate_collection(
    dataset: BeirDataset,
    path: str,
    embedder: Embedder,
    reranker: Reranking | None,
    options: EvalOptions,
    *,
    open_store: StoreFactory | None = None,
    baseline_embedder: Embedder | None = None,
    sparse: SparseEncoder | None = None,
    by_language: bool = False,
) -> list[DatasetResult]:
    """Run the chosen systems on one collection. Cosine is always run: it is the first
    stage of the reranker, the baseline of every comparison and the reference of ANN recall.
    `ann`, `bm25` and `hybrid` search a Qdrant collection of the corpus (`sparse` makes its
    BM25 vectors), as the server does. With `baseline_embedder`, its exact cosine run
    (`cosine-baseline`) is the baseline that cosine itself is compared against. With
    `by_language`, one result per query language, each scored on that language's queries
    against the whole collection."""
    queries = _evaluated_queries(dataset, options)
    qrels = {qid: dataset.qrels[qid] for qid in queries}
    runs, inputs = _system_runs(
        dataset, queries, embedder, reranker, options, open_store=open_store, sparse=sparse
    )
    if baseline_embedder is not None:
        runs[BASELINE_COSINE] = _cosine_run(baseline_embedder, dataset, queries, options)
    groups = {"": list(queries)}
    if by_language:
        groups = {}
        for qid in queries:
            groups.setdefault(dataset.query_languages.get(qid, "unknown"), []).append(qid)
    return [
        _scored_group(
            dataset,
            inputs,
            path=path,
            language=language,
            qids=qids,
            runs=runs,
            qrels=qrels,
            options=options,
        )
        for language, qids in groups.items()
    ]


def first_stage_runs(
    dataset: BeirDataset,
    queries: Mapping[str, str],
    embedder: Embedder,
    options: EvalOptions,
    *,
    open_store: StoreFactory | None = None,
    sparse: SparseEncoder | None = None,
) -> dict[str, Run]:
    """The top-100 runs of `options.systems` for `queries`, exactly as `ragrank eval` makes
    them (fine-tuning mines its negatives from these)."""
    runs, _ = _system_runs(
        dataset, queries, embedder, None, options, open_store=open_store, sparse=sparse
    )
    return runs


def _system_runs(
    dataset: BeirDataset,
    queries: Mapping[str, str],
    embedder: Embedder,
    reranker: Reranking | None,
    options: EvalOptions,
    *,
    open_store: StoreFactory | None,
    sparse: SparseEncoder | None,
) -> tuple[dict[str, Run], SystemInputs]:
    """Encode the corpus (cached) and the queries, index the corpus where a system searches
    Qdrant, and run every planned system."""
    doc_ids = list(dataset.corpus)
    passages = {doc_id: doc.passage for doc_id, doc in dataset.corpus.items()}
    timings: dict[str, float] = {}
    start = time.perf_counter()
    vectors, cached = dataset_vectors(embedder, dataset, options)
    timings["corpus_encode_s"] = time.perf_counter() - start
    timings["corpus_cached"] = float(cached)

    start = time.perf_counter()
    query_vectors = embedder.embed_queries(list(queries.values()))
    timings["embed_ms_per_query"] = _per_query_ms(start, len(queries))

    systems = plan(options.systems)
    inputs = SystemInputs(
        queries=queries,
        query_vectors=query_vectors,
        doc_ids=doc_ids,
        passages=passages,
        index=ExactIndex(vectors),
        options=options,
        reranker=reranker,
        timings=timings,
    )
    timings["faiss_gpu"] = float(inputs.index.gpu)
    key = corpus_key(embedder, dataset)
    with _store_for(
        systems, dataset, key, open_store=open_store, inputs=inputs, sparse=sparse, vectors=vectors
    ) as store:
        inputs.store = store
        runs = _run_systems(systems, inputs)
    return runs, inputs


def _scored_group(
    dataset: BeirDataset,
    inputs: SystemInputs,
    *,
    path: str,
    language: str,
    qids: list[str],
    runs: Mapping[str, Run],
    qrels: Qrels,
    options: EvalOptions,
) -> DatasetResult:
    """The result of the queries `qids` (one language's, or all when `language` is empty)."""
    queries = inputs.queries
    result = DatasetResult(
        name=f"{dataset.name}/{language}" if language else dataset.name,
        path=path,
        split=options.split,
        checksums=dataset.checksums,
        documents=len(dataset.corpus),
        judged_queries=len(dataset.judged_queries),
        queries={qid: queries[qid] for qid in qids},
        timings=dict(inputs.timings),
    )
    analysed = dict(zip(queries, inputs.query_sparse_languages, strict=False))
    result.sparse_query_languages = dict(
        Counter(str(analysed[q]) for q in qids if q in analysed).most_common()
    )
    group_runs = {name: {q: run[q] for q in qids if q in run} for name, run in runs.items()}
    if "ann" in group_runs:
        result.ann_recall = {
            f"recall@{k}": overlap_recall(group_runs["ann"], group_runs[BASELINE], k)
            for k in (10, TOP_K)
        }
    group_qrels = {q: qrels[q] for q in qids}
    _score(result, group_qrels, group_runs, options)
    for name, (model, logits) in inputs.reranked.items():
        calibration = inputs.reranker.calibration(model) if inputs.reranker else None
        group_logits = {q: logits[q] for q in qids if q in logits}
        result.reliability[name] = reliability(group_qrels, group_logits, calibration)
    return result


def _cosine_run(
    embedder: Embedder, dataset: BeirDataset, queries: Mapping[str, str], options: EvalOptions
) -> Run:
    """Exact cosine top-100 of one embedder (the corpus from the cache when it is there)."""
    doc_ids = list(dataset.corpus)
    vectors, _ = dataset_vectors(embedder, dataset, options)
    query_vectors = embedder.embed_queries(list(queries.values()))
    return exact_run(ExactIndex(vectors), list(queries), query_vectors, doc_ids, TOP_K)


def _run_systems(systems: Sequence[System], inputs: SystemInputs) -> dict[str, Run]:
    """Each system in turn, after the first stage it reorders; each one's milliseconds per
    query go into the timings under its own key."""
    runs: dict[str, Run] = {}
    inputs.runs = runs
    for system in systems:
        start = time.perf_counter()
        runs[system.name] = system.run(system, inputs)
        inputs.timings[system.timing_key] = _per_query_ms(start, len(inputs.queries))
    runs.update(inputs.extra_runs)
    return runs


def _score(
    result: DatasetResult, qrels: Qrels, runs: Mapping[str, Run], options: EvalOptions
) -> None:
    """Metrics, oracle@K and the paired comparisons against cosine (and cosine against the
    baseline embedder's, when there is one)."""
    result.oracle_k = options.oracle_depth
    result.oracle = {
        name: oracle_ndcg(qrels, run, options.oracle_depth)
        for name, run in runs.items()
        if name != BASELINE_COSINE
    }
    result.scores = {name: score_run(qrels, run, name) for name, run in runs.items()}
    result.comparisons = compare(
        qrels,
        {name: run for name, run in runs.items() if name != BASELINE_COSINE},
        result.scores,
        baseline="cosine",
    )
    for versus in options.versus:
        if versus in runs and versus != "cosine":
            result.comparisons += compare(
                qrels,
                {name: run for name, run in runs.items() if name != BASELINE_COSINE},
                result.scores,
                baseline=versus,
            )
    if BASELINE_COSINE in runs:
        result.comparisons += compare(
            qrels,
            {BASELINE_COSINE: runs[BASELINE_COSINE], "cosine": runs["cosine"]},
            result.scores,
            baseline=BASELINE_COSINE,
        )


@contextmanager
def _store_for(
    systems: Sequence[System],
    dataset: BeirDataset,
    key: str,
    *,
    open_store: StoreFactory | None,
    inputs: SystemInputs,
    sparse: SparseEncoder | None,
    vectors: Vectors,
) -> Iterator[Store | None]:
    """The Qdrant collection of the corpus, when a system searches one: indexed once, with
    BM25 vectors when a system needs them, as the server's would be; `None` otherwise."""
    if not any(system.needs_store for system in systems):
        yield None
        return
    if open_store is None:
        raise ValueError("the ann, bm25 and hybrid systems need a Qdrant store")
    lexical = any(system.needs_sparse for system in systems)
    if lexical and sparse is None:
        raise SettingsError("the bm25 and hybrid systems need BM25 vectors (RAGRANK_SPARSE)")
    documents = list(dataset.corpus.values())
    start = time.perf_counter()
    corpus_sparse = None
    stored: list[str | None] = []
    if lexical and sparse:
        passages = [d.passage for d in documents]
        languages = [sparse.language_of(d.passage, d.metadata) for d in documents]
        corpus_sparse = sparse.documents(passages, languages)
        if sparse.detects:
            stored = languages
            inputs.languages_stored = True
    inputs.timings["sparse_encode_s"] = time.perf_counter() - start
    if lexical and sparse:
        known = dataset.query_languages if inputs.options.query_language == "known" else {}
        analysed = [sparse.query(text, known.get(qid)) for qid, text in inputs.queries.items()]
        inputs.query_sparse = [query.vector for query in analysed]
        inputs.query_sparse_languages = [query.language for query in analysed]
    with open_store(dataset.name, key) as store:
        index_corpus(
            store,
            documents,
            vectors,
            corpus_sparse,
            languages=stored,
            progress=inputs.options.progress,
        )
        yield store


def corpus_key(embedder: Embedder, dataset: BeirDataset) -> str:
    """The embedding-cache key of `dataset`'s corpus as `embedder` encodes it (a merged
    collection's: of its parts' keys, in order)."""
    if dataset.parts:
        parts = "+".join(corpus_key(embedder, part) for part in dataset.parts)
        return hashlib.sha256(parts.encode()).hexdigest()[:32]
    corpus_file = next(name for name in dataset.checksums if name.startswith("corpus"))
    return cache_key(
        model_id=embedder.model_id,
        passage_prefix=embedder.passage_prefix,
        corpus_checksum=dataset.checksums[corpus_file],
        max_length=embedder.max_length,
        backend=embedder.backend,
    )


def evaluate_datasets(
    paths: Sequence[Path],
    embedder: Embedder,
    reranker: Reranking | None,
    options: EvalOptions,
    open_store: StoreFactory | None = None,
    *,
    baseline_embedder: Embedder | None = None,
    sparse: SparseEncoder | None = None,
    merge: Sequence[Path] = (),
) -> Iterator[DatasetResult]:
    """Each of `paths` on its own, then the folders of `merge` as one collection scored per
    query language."""
    for path in paths:
        log.info("evaluating %s", path)
        yield evaluate_dataset(
            path,
            embedder,
            reranker,
            options,
            open_store,
            baseline_embedder=baseline_embedder,
            sparse=sparse,
        )
    if merge:
        log.info("evaluating %d folders merged", len(merge))
        parts = [load_beir(path, split=options.split) for path in merge]
        yield from evaluate_collection(
            merge_beir(parts, options.relevance),
            ",".join(str(path) for path in merge),
            embedder,
            reranker,
            options,
            open_store=open_store,
            baseline_embedder=baseline_embedder,
            sparse=sparse,
            by_language=True,
        )


def _evaluated_queries(dataset: BeirDataset, options: EvalOptions) -> dict[str, str]:
    """The judged queries in file order: those on the test side of `--split-by` when it is
    given, the first `--limit-queries` of them when limited: of each part, in a merged
    collection, so that it holds the same queries as its parts' own evaluations."""
    judged = dataset.judged_queries
    missing = len(dataset.qrels) - len(judged)
    if missing:
        log.warning("%s: %d judged query ids are not in queries.jsonl", dataset.name, missing)
    if not judged:
        raise DocumentError(f"{dataset.name}: no query of queries.jsonl has relevance labels")
    split = group_split(options)
    if split is not None:
        judged = {qid: judged[qid] for qid in split.queries(dataset, "test", judged)}
        if not judged:
            raise DocumentError(
                f"{dataset.name}: no judged query is on the test side of --split-by"
            )
    limit = options.limit_queries
    if not limit:
        return judged
    if not dataset.parts:
        return dict(list(judged.items())[:limit])
    kept: dict[str, str] = {}
    for part in dataset.parts:
        ids = [qid for qid in judged if qid.startswith(f"{part.name}/")][:limit]
        kept.update({qid: judged[qid] for qid in ids})
    return kept


def dataset_vectors(
    embedder: Embedder, dataset: BeirDataset, options: EvalOptions
) -> tuple[Vectors, bool]:
    """The corpus embeddings of `dataset`, in corpus order: a merged collection's are its
    parts', each cached under its own key, so merging re-embeds nothing."""
    if dataset.parts:
        loaded = [dataset_vectors(embedder, part, options) for part in dataset.parts]
        return np.concatenate([v for v, _ in loaded]), all(c for _, c in loaded)
    doc_ids = list(dataset.corpus)
    texts = [dataset.corpus[d].passage for d in doc_ids]
    return corpus_vectors(embedder, doc_ids, texts, corpus_key(embedder, dataset), options)


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
