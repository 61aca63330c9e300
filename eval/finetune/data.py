"""Training data from BEIR qrels: which queries train, which validate, which are never seen,
and hard negatives mined from the configured embedder's exact cosine top-k; fixed when a run
starts and kept in its folder, so that a resumed run trains on the same data."""

from __future__ import annotations

import json
import logging
import os
import random
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from eval.embedding_cache import model_fingerprint
from eval.exact import ExactIndex
from eval.options import EvalOptions, FinetuneOptions
from eval.runs import exact_run
from eval.suite import corpus_key, corpus_vectors
from ragrank.beir import BeirDataset, Qrels, load_beir, load_qrels
from ragrank.errors import DocumentError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from ragrank.protocols import TextEmbedder as Embedder
    from ragrank.protocols import Vectors

log = logging.getLogger(__name__)

#: A run folder's layout. The validation metric is named as the trainer logs it (evaluator
#: "val").
VALIDATION_METRIC = "eval_val_ndcg@10"
DATA_FILE = "training-data.json"
RUN_FILE = "run.json"
MODEL_FOLDER = "model"
CHECKPOINTS = "checkpoints"


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


@dataclass(frozen=True)
class TrainingData:
    """The split, the mined negatives and each validation query's candidates, fixed when a
    run starts and read back when it resumes."""

    split: QuerySplit
    negatives: dict[str, list[str]]
    #: Validation query id → the mining embedder's cosine top documents, best first.
    validation_candidates: dict[str, list[str]]
    mining_model: str

    def to_json(self) -> dict[str, Any]:
        return {
            "split": asdict(self.split),
            "negatives": self.negatives,
            "validation_candidates": self.validation_candidates,
            "mining_model": self.mining_model,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingData:
        split = data["split"]
        return cls(
            split=QuerySplit(
                train=tuple(split["train"]),
                validation=tuple(split["validation"]),
                held_out=tuple(split["held_out"]),
            ),
            negatives={qid: list(ids) for qid, ids in data["negatives"].items()},
            validation_candidates={
                qid: list(ids) for qid, ids in data["validation_candidates"].items()
            },
            mining_model=data["mining_model"],
        )


def load_dataset(options: FinetuneOptions) -> tuple[BeirDataset, dict[str, dict[str, int]]]:
    """The training split and the qrels of the held-out split (empty when there is none)."""
    if not options.dataset.is_dir():
        raise DocumentError(f"--dataset {options.dataset}: not a folder")
    dataset = load_beir(options.dataset, split=options.split)
    held_out: dict[str, dict[str, int]] = {}
    if options.held_out_split is not None:
        path = options.dataset / "qrels" / f"{options.held_out_split}.tsv"
        if path.exists():
            held_out = load_qrels(path)
        else:
            log.warning("%s does not exist: no query is held out", path)
    return dataset, held_out


def prepare_data(
    dataset: BeirDataset,
    held_out: Mapping[str, Mapping[str, int]],
    embedder: Embedder,
    options: FinetuneOptions,
) -> TrainingData:
    """Split the queries, mine hard negatives with `embedder` and save both for a resume."""
    split = split_queries(
        dataset,
        held_out,
        validation_fraction=options.validation_fraction,
        seed=options.seed,
    )
    doc_ids = list(dataset.corpus)
    texts = {doc_id: doc.passage for doc_id, doc in dataset.corpus.items()}
    vectors, _ = corpus_vectors(
        embedder,
        doc_ids,
        [texts[doc_id] for doc_id in doc_ids],
        corpus_key(embedder, dataset),
        EvalOptions(cache_dir=options.cache_dir, progress=options.progress),
    )
    query_ids = [*split.train, *split.validation]
    query_vectors = embedder.embed_queries([dataset.queries[qid] for qid in query_ids])
    most_positives = max(len(positives(dataset.qrels, qid)) for qid in query_ids)
    depth = max(options.mine_depth, options.validation_candidates) + most_positives
    candidates = ranked_candidates(ExactIndex(vectors), doc_ids, query_ids, query_vectors, depth)
    negatives = mine_hard_negatives(
        {qid: candidates[qid][: options.mine_depth + most_positives] for qid in split.train},
        dataset.qrels,
        {doc_id: row for row, doc_id in enumerate(doc_ids)},
        vectors,
        texts,
        count=options.negatives,
        near_duplicate=options.near_duplicate,
        seed=options.seed,
    )
    if not any(negatives.values()):
        raise DocumentError(
            f"no hard negative was found for any query in the top {options.mine_depth}: every "
            f"candidate is a positive or at least --near-duplicate {options.near_duplicate} "
            "cosine-similar to one; raise --near-duplicate or --mine-depth"
        )
    short = sum(len(found) < options.negatives for found in negatives.values())
    if short:
        log.warning(
            "%d of %d training queries have fewer than %d hard negatives in the top %d",
            short,
            len(negatives),
            options.negatives,
            options.mine_depth,
        )
    data = TrainingData(
        split=split,
        negatives=negatives,
        validation_candidates={
            qid: candidates[qid][: options.validation_candidates] for qid in split.validation
        },
        mining_model=model_fingerprint(embedder.model_id),
    )
    write_json(options.output / DATA_FILE, data.to_json())
    return data


def saved_data(options: FinetuneOptions) -> TrainingData | None:
    """What an interrupted run of the same options fixed, so a resumed run trains on the same
    split and negatives without loading the mining model again."""
    path = options.output / DATA_FILE
    if not path.exists():
        return None
    return TrainingData.from_json(json.loads(path.read_text(encoding="utf-8")))


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically: a run killed mid-write leaves the previous file whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
