"""Training data from BEIR qrels: which queries train, which validate, which are never seen,
and hard negatives mined from the configured embedder's exact cosine top-k; fixed when a run
starts and kept in its folder, so that a resumed run trains on the same data."""

from __future__ import annotations

import json
import logging
import os
import random
import re
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from eval.embedding_cache import model_fingerprint
from eval.exact import ExactIndex
from eval.options import EvalOptions, FinetuneOptions
from eval.runs import exact_run, ranked
from eval.splits import SIDES, GroupSplit, check_sides, group_split
from eval.suite import StoreFactory, dataset_vectors, first_stage_runs
from ragrank.beir import BeirDataset, Qrels, load_beir, load_qrels, load_queries, merge_beir
from ragrank.errors import DocumentError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from ragrank.protocols import TextEmbedder as Embedder
    from ragrank.protocols import Vectors
    from ragrank.sparse import SparseEncoder
    from ragrank.store.fusion import FusionSettings

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


def split_by_group(
    dataset: BeirDataset, split: GroupSplit, *, limit_validation: int | None, seed: int
) -> QuerySplit:
    """Train and validation queries by `--split-by`: the judged queries (with a positive)
    whose value is on each side; the test side's are `held_out`, never trained, validated or
    mined for. `limit_validation` keeps a seeded sample of the validation side."""
    judged = [qid for qid in sorted(dataset.judged_queries) if positives(dataset.qrels, qid)]
    sides = {side: split.queries(dataset, side, judged) for side in SIDES}
    check_sides(split.groups(dataset, judged))
    if not sides["train"] or not sides["validation"]:
        raise DocumentError(
            f"--split-by {split.field}: {len(sides['train'])} training and "
            f"{len(sides['validation'])} validation queries; each side needs one "
            "(change --test-share or --validation-share)"
        )
    validation = sides["validation"]
    if limit_validation is not None and len(validation) > limit_validation:
        validation = sorted(random.Random(seed).sample(validation, limit_validation))
    return QuerySplit(
        train=tuple(sides["train"]), validation=tuple(validation), held_out=tuple(sides["test"])
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
    #: Train query id → the first stage's top documents, best first (what a teacher scores).
    train_candidates: dict[str, list[str]] | None = None
    #: `--split-by`'s definition and the values on each side.
    groups: dict[str, Any] | None = None
    miner: str = "cosine"
    #: Queries without labels to distil on (`--unlabelled-queries`): id → text.
    unlabelled: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "split": asdict(self.split),
            "groups": self.groups,
            "miner": self.miner,
            "negatives": self.negatives,
            "validation_candidates": self.validation_candidates,
            "train_candidates": self.train_candidates,
            "unlabelled": self.unlabelled,
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
            train_candidates=data.get("train_candidates"),
            groups=data.get("groups"),
            miner=data.get("miner", "cosine"),
            unlabelled=data.get("unlabelled"),
        )


def load_dataset(options: FinetuneOptions) -> tuple[BeirDataset, dict[str, dict[str, int]]]:
    """The training collection (one folder, or `--merge`'s folders as one) and the qrels of the
    held-out split (empty when there is none, or when `--split-by` holds queries out)."""
    folders = [options.dataset] if options.dataset is not None else list(options.merge)
    for folder in folders:
        if not folder.is_dir():
            flag = "--dataset" if options.dataset is not None else "--merge"
            raise DocumentError(f"{flag} {folder}: not a folder")
    parts = [load_beir(folder, split=options.split) for folder in folders]
    dataset = parts[0] if options.dataset is not None else merge_beir(parts)
    held_out: dict[str, dict[str, int]] = {}
    if options.held_out_split is not None and options.split_by is None:
        for folder in folders:
            path = folder / "qrels" / f"{options.held_out_split}.tsv"
            if not path.exists():
                log.warning("%s does not exist: no query is held out", path)
                continue
            prefix = f"{folder.name}/" if options.dataset is None else ""
            held_out |= {f"{prefix}{qid}": docs for qid, docs in load_qrels(path).items()}
    return dataset, held_out


@dataclass(frozen=True)
class Miner:
    """The first stage fine-tuning mines with: the embedder, and for `hybrid` the BM25 encoder,
    a store to search and the fusion, as `ragrank eval` and the server run it."""

    embedder: Embedder
    sparse: SparseEncoder | None = None
    open_store: StoreFactory | None = None
    fusion: FusionSettings | None = None


def prepare_data(
    dataset: BeirDataset,
    held_out: Mapping[str, Mapping[str, int]],
    miner: Miner,
    options: FinetuneOptions,
    *,
    unlabelled: Mapping[str, str] | None = None,
) -> TrainingData:
    """Split the queries, mine hard negatives with the first stage and save both for a
    resume. `unlabelled` queries get first-stage candidates too (to distil on); one with the
    text of a held-out query is dropped."""
    split, groups = _split(dataset, held_out, options)
    extra = _unlabelled(dataset, split, unlabelled or {})
    embedder = miner.embedder
    doc_ids = list(dataset.corpus)
    texts = {doc_id: doc.passage for doc_id, doc in dataset.corpus.items()}
    eval_options = mining_options(options, miner)
    vectors, _ = dataset_vectors(embedder, dataset, eval_options)
    query_ids = [*split.train, *split.validation]
    texts_of = {**dataset.queries, **extra}
    most_positives = max(len(positives(dataset.qrels, qid)) for qid in query_ids)
    depth = max(options.mine_depth, options.validation_candidates) + most_positives
    searched = {qid: texts_of[qid] for qid in [*query_ids, *extra]}
    candidates = _first_stage(dataset, searched, miner, eval_options, vectors=vectors, depth=depth)
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
        train_candidates={
            qid: candidates[qid][: options.mine_depth] for qid in [*split.train, *extra]
        },
        unlabelled=extra or None,
        groups=groups,
        miner=options.mine_with,
    )
    write_json(options.output / DATA_FILE, data.to_json())
    return data


def _unlabelled(
    dataset: BeirDataset, split: QuerySplit, unlabelled: Mapping[str, str]
) -> dict[str, str]:
    """The unlabelled queries to distil on, less any with the text of a held-out query."""
    held_out_texts = {normalise(dataset.queries[qid]) for qid in split.held_out}
    kept = {qid: text for qid, text in unlabelled.items() if normalise(text) not in held_out_texts}
    if len(kept) < len(unlabelled):
        log.warning(
            "%d unlabelled queries have the text of a held-out query and were dropped",
            len(unlabelled) - len(kept),
        )
    return kept


def _first_stage(
    dataset: BeirDataset,
    queries: Mapping[str, str],
    miner: Miner,
    options: EvalOptions,
    *,
    vectors: Vectors,
    depth: int,
) -> dict[str, list[str]]:
    """Each query's first-stage top `depth` document ids, best first: exact cosine, or the
    system `options` names (hybrid) as `ragrank eval` runs it."""
    (system,) = options.systems
    if system == "cosine":
        query_vectors = miner.embedder.embed_queries(list(queries.values()))
        index = ExactIndex(vectors)
        return ranked_candidates(index, list(dataset.corpus), list(queries), query_vectors, depth)
    run = first_stage_runs(
        dataset,
        queries,
        miner.embedder,
        options,
        open_store=miner.open_store,
        sparse=miner.sparse,
    )[system]
    return {qid: ranked(run[qid])[:depth] for qid in queries}


def _split(
    dataset: BeirDataset, held_out: Mapping[str, Mapping[str, int]], options: FinetuneOptions
) -> tuple[QuerySplit, dict[str, Any] | None]:
    """The queries by role, by `--split-by` (with its definition and sides, for the record)
    or by `--held-out-split` and `--validation-fraction`; `--validation-queries` samples the
    validation side."""
    definition = group_split(options)
    if definition is not None:
        split = split_by_group(
            dataset, definition, limit_validation=options.validation_queries, seed=options.seed
        )
        judged = [qid for qid in dataset.judged_queries if positives(dataset.qrels, qid)]
        return split, definition.describe(dataset, judged)
    split = split_queries(
        dataset, held_out, validation_fraction=options.validation_fraction, seed=options.seed
    )
    limit = options.validation_queries
    if limit is not None and len(split.validation) > limit:
        kept = random.Random(options.seed).sample(list(split.validation), limit)
        split = replace(split, validation=tuple(sorted(kept)))
    return split, None


def mining_options(options: FinetuneOptions, miner: Miner) -> EvalOptions:
    """The eval's options for the first stage fine-tuning mines with: its system, the corpus
    cache, the fusion the server uses, and `--exact-search`."""
    fusion = miner.fusion
    extra: dict[str, Any] = {}
    if fusion is not None:
        extra = {
            "fusion": fusion.fusion,
            "rrf_k": fusion.rrf_k,
            "rrf_dense_weight": fusion.rrf_dense_weight,
            "rrf_sparse_weight": fusion.rrf_sparse_weight,
            "fusion_other_languages": fusion.fusion_other_languages,
        }
    return EvalOptions(
        systems=(options.mine_with,),
        cache_dir=options.cache_dir,
        progress=options.progress,
        exact_search=options.exact_search,
        **extra,
    )


def read_unlabelled(path: Path | None) -> dict[str, str]:
    """`--unlabelled-queries`: a queries.jsonl (`_id`, `text`) or a text file of one query a
    line; ids get an `unlabelled/` prefix so they never meet a collection's."""
    if path is None:
        return {}
    if not path.is_file():
        raise DocumentError(f"--unlabelled-queries {path}: not a file")
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        queries = load_queries(path)
    else:
        lines = path.read_text(encoding="utf-8").splitlines()
        queries = {str(number): line.strip() for number, line in enumerate(lines) if line.strip()}
    if not queries:
        raise DocumentError(f"--unlabelled-queries {path}: no query in it")
    return {f"unlabelled/{qid}": text for qid, text in queries.items()}


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
