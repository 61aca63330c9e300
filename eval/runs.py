"""The systems the suite compares, each producing a run (query id → doc id → score): exact
cosine (faiss), the cross-encoder over a first stage's top candidates, and Qdrant's own
search: dense (ANN), BM25 sparse, and hybrid (both fused), as the server runs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from ragrank.blend import reranked_order
from ragrank.cascade import cascade_order, shortlist
from ragrank.documents import Chunk, Document

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from eval.exact import ExactIndex
    from eval.metrics import Run
    from ragrank.engine import BatchStats
    from ragrank.protocols import Reranking, Vectors
    from ragrank.sparse import SparseVector
    from ragrank.store import Fusion, Store


def exact_run(
    index: ExactIndex,
    query_ids: Sequence[str],
    query_vectors: Vectors,
    doc_ids: Sequence[str],
    k: int,
) -> dict[str, dict[str, float]]:
    """Cosine top-k of every query by exact search."""
    scores, rows = index.search(query_vectors, k)
    return {
        qid: {
            doc_ids[row]: float(score)
            for score, row in zip(q_scores, q_rows, strict=True)
            if row >= 0
        }
        for qid, q_scores, q_rows in zip(query_ids, scores, rows, strict=True)
    }


def ranked(ranking: Mapping[str, float]) -> list[str]:
    """Document ids by descending score."""
    return sorted(ranking, key=lambda doc_id: ranking[doc_id], reverse=True)


def rerank_run(
    inference: Reranking,
    queries: Mapping[str, str],
    first_stage: Run,
    passages: Mapping[str, str],
    *,
    candidates: int,
    progress: bool = True,
    model: str | None = None,
) -> tuple[dict[str, dict[str, float]], int]:
    """Rerank each query's top `candidates` from `first_stage` with the inference's reranker
    `model` names (absent: the default), each document scored by its best window as the
    server scores it. Ranks after `candidates` keep the first stage's order below the
    reranked ones, so Recall@100 stays comparable.

    Every query goes through `Inference.rerank_all`: windows planned from ids tokenised once,
    all queued together, batched across queries by the engine (an offline inference's window
    policy: length-sorted batches, padding being a cross-encoder batch's main waste).
    Returns the run and the number of (query, window) pairs scored.
    """
    first_order = {qid: ranked(first_stage.get(qid, {})) for qid in queries}
    requests = [
        (query, [passages[doc_id] for doc_id in first_order[qid][:candidates]])
        for qid, query in queries.items()
    ]
    with tqdm(desc="reranking", unit="pair", disable=not progress) as bar:

        def report(stats: BatchStats) -> None:
            bar.update(stats.items)

        inference.on_batch.append(report)
        try:
            outcomes = inference.call(inference.rerank_all(requests, model=model))
        finally:
            inference.on_batch.remove(report)

    best: dict[str, dict[str, float]] = {}
    for qid, outcome in zip(queries, outcomes, strict=True):
        doc_ids = first_order[qid][:candidates]
        scores = dict(zip(doc_ids, outcome.logits, strict=True))
        best[qid] = _below(scores, first_order[qid][candidates:])
    return best, sum(outcome.pairs for outcome in outcomes)


def blended_run(
    first_stage: Run,
    reranked: Mapping[str, Mapping[str, float]],
    *,
    candidates: int,
    blend: float,
) -> Run:
    """Each query's top `candidates` of `first_stage` in the blend of that order and the
    reranker's (`reranked`: its score of each), by the serving rule (`ragrank.blend`); the rest
    below, in the first stage's order."""
    run: dict[str, dict[str, float]] = {}
    for qid, scores in reranked.items():
        order = ranked(first_stage.get(qid, {}))
        top = order[:candidates]
        picked = reranked_order([scores[doc_id] for doc_id in top], blend)
        placed = {top[i]: float(len(top) - place) for place, i in enumerate(picked)}
        run[qid] = _below(placed, order[candidates:])
    return run


def _below(scores: dict[str, float], rest: Sequence[str]) -> dict[str, float]:
    """`scores`, with the documents of `rest` after them in their order, so that ranks past
    the reranked ones keep the first stage's order (and Recall@100 stays comparable)."""
    floor = min(scores.values(), default=0.0)
    scores.update({doc_id: floor - 1.0 - rank for rank, doc_id in enumerate(rest)})
    return scores


def cascade_run(
    inference: Reranking,
    queries: Mapping[str, str],
    first_stage: Run,
    fast: Run,
    passages: Mapping[str, str],
    *,
    candidates: int,
    top: int,
    large: Run | None = None,
    blend: float = 0.0,
    progress: bool = True,
) -> tuple[dict[str, dict[str, float]], int]:
    """The cascade over each query's top `candidates` of `first_stage`: `fast` (the fast
    reranker's run over the same candidates) shortlists its `top`, which the default reranker
    rescores, merged by the serving rule (`ragrank.cascade`). `large`, the default
    reranker's run over the same candidates, supplies those scores when given (the same
    pairs scored once); otherwise the shortlists are reranked. `blend` mixes the first stage's
    order into both stages' orders, as the server does. Returns the run and the pairs the
    default reranker scored."""
    first_order = {qid: ranked(first_stage.get(qid, {}))[:candidates] for qid in queries}
    shortlists: dict[str, list[int]] = {}
    fast_scores: dict[str, list[float]] = {}
    for qid in queries:
        fast_scores[qid] = [fast[qid][doc_id] for doc_id in first_order[qid]]
        shortlists[qid] = shortlist(fast_scores[qid], top, blend)
    if large is not None:
        second = {
            qid: [large[qid][first_order[qid][i]] for i in shortlists[qid]] for qid in queries
        }
        pairs = sum(len(short) for short in shortlists.values())
    else:
        short_run, pairs = rerank_run(
            inference,
            queries,
            {
                qid: {first_order[qid][i]: -float(rank) for rank, i in enumerate(short)}
                for qid, short in shortlists.items()
            },
            passages,
            candidates=top,
            progress=progress,
        )
        second = {
            qid: [short_run[qid][first_order[qid][i]] for i in shortlists[qid]] for qid in queries
        }
    run: dict[str, dict[str, float]] = {}
    for qid in queries:
        merged = cascade_order(fast_scores[qid], shortlists[qid], second[qid], blend)
        scores = {first_order[qid][i]: -float(position) for position, i in enumerate(merged.order)}
        rest = [d for d in ranked(first_stage.get(qid, {})) if d not in scores]
        run[qid] = _below(scores, rest)
    return run, pairs


def index_corpus(
    store: Store,
    documents: Sequence[Document],
    vectors: Vectors,
    sparse: Sequence[SparseVector] | None = None,
    *,
    languages: Sequence[str | None] = (),
    progress: bool = True,
) -> None:
    """Upsert one point per document (deterministic ids), with its BM25 vector when given
    and, as the indexer stores it, the language BM25 read it in as its `lang` metadata,
    unless the collection holds them already."""
    store.ensure_collection(vectors.shape[1])
    if store.count() == len(documents):
        return
    step = 256
    with tqdm(total=len(documents), desc="indexing", unit="doc", disable=not progress) as bar:
        for start in range(0, len(documents), step):
            batch = documents[start : start + step]
            chunks = [
                Chunk(
                    doc_id=d.doc_id,
                    chunk_index=0,
                    text=d.text,
                    title=d.title,
                    end=len(d.text),
                    metadata=_language(languages, start + i),
                )
                for i, d in enumerate(batch)
            ]
            lexical = None if sparse is None else sparse[start : start + step]
            store.upsert(chunks, vectors[start : start + step], sparse=lexical)
            bar.update(len(batch))
    store.optimize()


def _language(languages: Sequence[str | None], row: int) -> dict[str, str]:
    language = languages[row] if languages else None
    return {"lang": language} if language else {}


def store_run(
    store: Store,
    query_ids: Sequence[str],
    k: int,
    *,
    dense: Vectors | None = None,
    sparse: Sequence[SparseVector] | None = None,
    fusion: Fusion | None = None,
    languages: Sequence[str | None] = (),
    exact: bool = False,
) -> dict[str, dict[str, float]]:
    """Each query's top-k from Qdrant's own search: by the dense vectors (through the HNSW
    graph), by the BM25 vectors, or, given both, the two fused, as the server fuses them
    (`languages`: the ones BM25 read each query in, when the passages carry theirs; `exact`:
    the dense search scans every vector, skipping the graph)."""
    run = {}
    for row, qid in enumerate(query_ids):
        language = languages[row] if languages else None
        hits = store.search(
            None if dense is None else dense[row],
            k,
            sparse=None if sparse is None else sparse[row],
            fusion=fusion,
            languages=language.split("+") if language else (),
            exact=exact,
        )
        run[qid] = {hit.chunk.doc_id: hit.retrieval_score for hit in hits}
    return run


def overlap_recall(approximate: Run, exact: Run, k: int) -> float:
    """Mean fraction of each query's exact top-k that the approximate top-k also returns."""
    fractions = [
        len(set(ranked(approximate.get(qid, {}))[:k]) & set(ranked(ranking)[:k]))
        / max(1, min(k, len(ranking)))
        for qid, ranking in exact.items()
    ]
    return float(np.mean(fractions)) if fractions else 0.0
