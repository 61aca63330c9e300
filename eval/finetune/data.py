"""Training data from BEIR qrels: which queries train, which validate, which are never seen,
and hard negatives mined from the configured embedder's exact cosine top-k."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from eval.beir import BeirDataset, Qrels
from eval.exact import ExactIndex
from eval.runs import exact_run
from ragrank.errors import DocumentError
from ragrank.models import Vectors


@dataclass(frozen=True)
class QuerySplit:
    """Query ids by role. `held_out` are the training-split queries dropped because the
    evaluation split has them (same id, or the same text)."""

    train: tuple[str, ...]
    validation: tuple[str, ...]
    held_out: tuple[str, ...]


def positives(qrels: Qrels, qid: str) -> set[str]:
    """The documents labelled relevant (score above 0) for one query."""
    return {doc_id for doc_id, score in qrels.get(qid, {}).items() if score > 0}


def normalise(text: str) -> str:
    """Case- and whitespace-insensitive form, to compare texts for identity."""
    return re.sub(r"\s+", " ", text).strip().casefold()


def split_queries(
    dataset: BeirDataset,
    held_out_qrels: Qrels,
    *,
    validation_fraction: float,
    seed: int,
) -> QuerySplit:
    """Split the judged queries of the training split (those with a positive) into train and
    validation, after removing every query the evaluation split (`held_out_qrels`) judges,
    by id or by identical text. The shuffle is seeded; ids are sorted first so the split does
    not depend on file order."""
    held_out_texts = {
        normalise(dataset.queries[qid]) for qid in held_out_qrels if qid in dataset.queries
    }
    usable: list[str] = []
    held_out: list[str] = []
    for qid in sorted(dataset.judged_queries):
        if qid in held_out_qrels or normalise(dataset.queries[qid]) in held_out_texts:
            held_out.append(qid)
        elif positives(dataset.qrels, qid):
            usable.append(qid)
    if len(usable) < 2:
        raise DocumentError(
            f"{dataset.name}: {len(usable)} training queries with a relevant document; "
            "fine-tuning needs at least 2 (one to train, one to validate)"
        )
    random.Random(seed).shuffle(usable)
    count = min(len(usable) - 1, max(1, round(validation_fraction * len(usable))))
    return QuerySplit(
        train=tuple(sorted(usable[count:])),
        validation=tuple(sorted(usable[:count])),
        held_out=tuple(held_out),
    )


def ranked_candidates(
    index: ExactIndex,
    doc_ids: Sequence[str],
    query_ids: Sequence[str],
    query_vectors: Vectors,
    depth: int,
) -> dict[str, list[str]]:
    """Each query's exact cosine top-`depth` document ids, best first."""
    run = exact_run(index, query_ids, query_vectors, doc_ids, depth)
    return {qid: list(ranking) for qid, ranking in run.items()}


def mine_hard_negatives(
    candidates: Mapping[str, Sequence[str]],
    qrels: Qrels,
    doc_rows: Mapping[str, int],
    doc_vectors: Vectors,
    texts: Mapping[str, str],
    *,
    count: int,
    near_duplicate: float,
    seed: int,
) -> dict[str, list[str]]:
    """Up to `count` negatives per query, drawn at random (seeded) from its cosine top-k
    minus its labelled positives and minus near-duplicates of a positive: a cosine of at
    least `near_duplicate` to one, or the same text. Near-duplicates and unlabelled
    relevant documents are the false negatives that hurt training most; drawing from the
    whole top-k rather than its head keeps fewer of the latter."""
    rng = random.Random(seed)
    mined: dict[str, list[str]] = {}
    for qid in sorted(candidates):
        relevant = positives(qrels, qid)
        if not relevant:
            raise DocumentError(f"query {qid!r} has no relevant document to mine around")
        positive_vectors = doc_vectors[[doc_rows[doc_id] for doc_id in sorted(relevant)]]
        positive_texts = {normalise(texts[doc_id]) for doc_id in relevant}
        pool = [doc_id for doc_id in candidates[qid] if doc_id not in relevant]
        if pool:
            similarity = doc_vectors[[doc_rows[doc_id] for doc_id in pool]] @ positive_vectors.T
            closest = np.max(similarity, axis=1)
            pool = [
                doc_id
                for doc_id, score in zip(pool, closest.tolist(), strict=True)
                if score < near_duplicate and normalise(texts[doc_id]) not in positive_texts
            ]
        mined[qid] = rng.sample(pool, min(count, len(pool)))
    return mined
