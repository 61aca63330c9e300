"""What the two fine-tuning commands share: options, the persisted training data (split and
mined negatives), validation NDCG@10 as a sentence-transformers evaluator, the trainer's
arguments, resuming, and the training report."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from sentence_transformers.base.evaluation.evaluator import BaseEvaluator

from eval.beir import BeirDataset, load_beir, load_qrels
from eval.embedding_cache import model_fingerprint
from eval.exact import ExactIndex
from eval.finetune.data import (
    QuerySplit,
    mine_hard_negatives,
    positives,
    ranked_candidates,
    split_queries,
)
from eval.metrics import Run, score_run
from eval.suite import EvalOptions, corpus_key, corpus_vectors
from ragrank.device import resolve_placement
from ragrank.errors import DocumentError, SettingsError
from ragrank.models import Embedder, SentenceTransformerEmbedder
from ragrank.settings import Settings, env_name

log = logging.getLogger(__name__)

#: The headline validation metric, as the trainer logs it (evaluator name "val").
VALIDATION_METRIC = "eval_val_ndcg@10"
DATA_FILE = "training-data.json"
RUN_FILE = "run.json"
MODEL_FOLDER = "model"
CHECKPOINTS = "checkpoints"
LOSSES = ("bce", "listnet", "mnrl")


@dataclass(frozen=True)
class FinetuneOptions:
    """Flags of `ragrank finetune reranker|embedder`; see the CLI's help for each."""

    dataset: Path
    output: Path
    #: The model to start from (None: the configured model of the role).
    base: str | None = None
    split: str = "train"
    #: The evaluation split whose queries training must never see (None: no such split).
    held_out_split: str | None = "test"
    epochs: float = 3.0
    learning_rate: float = 3e-5
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    batch_size: int = 16
    loss: str = "bce"
    negatives: int = 4
    mine_depth: int = 30
    near_duplicate: float = 0.95
    validation_fraction: float = 0.1
    validation_candidates: int = 20
    max_length: int = 256
    seed: int = 42
    max_steps: int | None = None
    cache_dir: Path | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        checks = {
            "--epochs must be above 0": self.epochs > 0,
            "--learning-rate must be above 0": self.learning_rate > 0,
            "--warmup-ratio must be in [0, 1)": 0 <= self.warmup_ratio < 1,
            "--weight-decay must be at least 0": self.weight_decay >= 0,
            "--batch-size must be at least 2": self.batch_size >= 2,
            f"--loss must be one of {', '.join(LOSSES)}": self.loss in LOSSES,
            "--negatives must be at least 1": self.negatives >= 1,
            "--mine-depth must be above --negatives": self.mine_depth > self.negatives,
            "--near-duplicate must be in (0, 1]": 0 < self.near_duplicate <= 1,
            "--validation-fraction must be in (0, 0.5]": 0 < self.validation_fraction <= 0.5,
            "--validation-candidates must be at least 10": self.validation_candidates >= 10,
            "--max-length must be at least 16": self.max_length >= 16,
            "--max-steps must be at least 1": self.max_steps is None or self.max_steps >= 1,
        }
        failed = [message for message, ok in checks.items() if not ok]
        if failed:
            raise SettingsError("; ".join(failed))
        if self.held_out_split == self.split:
            raise SettingsError(f"--held-out-split {self.split!r} is the training split")

    def recorded(self) -> dict[str, Any]:
        """The options that shape the run (not how it is shown), JSON-ready."""
        shown = {"progress", "cache_dir"}
        return {
            f.name: str(value) if isinstance(value := getattr(self, f.name), Path) else value
            for f in fields(self)
            if f.name not in shown
        }


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


def start_run(role: str, options: FinetuneOptions) -> bool:
    """Create or reopen the output folder. False when it already holds a finished run;
    raises when it holds a different run (other options or another role)."""
    options.output.mkdir(parents=True, exist_ok=True)
    recorded = options.recorded()
    record = {"role": role, "options": recorded}
    path = options.output / RUN_FILE
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        if previous != record:
            changed = sorted(
                key for key in recorded if previous.get("options", {}).get(key) != recorded[key]
            )
            what = f"the options {', '.join(changed)}" if changed else "the role"
            raise SettingsError(
                f"--output {options.output} holds another fine-tuning run (it differs in "
                f"{what}); resume it with the same flags or choose another --output"
            )
        if (options.output / MODEL_FOLDER).is_dir() and (options.output / "report.json").exists():
            return False
        log.info("resuming the run in %s", options.output)
    else:
        _write_json(path, record)
    return True


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
    _write_json(options.output / DATA_FILE, data.to_json())
    return data


def saved_data(options: FinetuneOptions) -> TrainingData | None:
    """What an interrupted run of the same options fixed, so a resumed run trains on the same
    split and negatives without loading the mining model again."""
    path = options.output / DATA_FILE
    if not path.exists():
        return None
    return TrainingData.from_json(json.loads(path.read_text(encoding="utf-8")))


class ValidationNdcg(BaseEvaluator):
    """NDCG@10 (and Recall@10, MRR@10) of the validation queries, by ranx, as a
    sentence-transformers evaluator: the trainer logs it as `eval_val_ndcg@10` each epoch and
    keeps the checkpoint where it peaks. `rank` turns the model being trained into a run."""

    name = "val"

    def __init__(self, rank: Callable[[Any], Run], qrels: Mapping[str, Mapping[str, int]]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._rank = rank
        self.qrels = qrels
        self.primary_metric = f"{self.name}_ndcg@10"

    def __call__(
        self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1
    ) -> dict[str, float]:
        scores = score_run(self.qrels, self._rank(model), "validation")
        return {
            f"{self.name}_{metric}": scores.means[metric]
            for metric in ("ndcg@10", "recall@10", "mrr@10")
        }


def training_arguments(options: FinetuneOptions, device: str, **extra: Any) -> dict[str, Any]:
    """Keyword arguments for sentence-transformers' TrainingArguments: linear schedule with
    warm-up, AdamW with weight decay, a checkpoint and a validation pass per epoch (every
    `max_steps` steps for a capped run), and the best checkpoint by validation NDCG@10."""
    per_epoch = options.max_steps is None
    cuda = device.startswith("cuda")
    bf16 = cuda and _cuda_bf16()
    return {
        "output_dir": str(options.output / CHECKPOINTS),
        "num_train_epochs": options.epochs,
        "max_steps": options.max_steps or -1,
        "per_device_train_batch_size": options.batch_size,
        "per_device_eval_batch_size": options.batch_size,
        "learning_rate": options.learning_rate,
        "warmup_steps": options.warmup_ratio,
        "weight_decay": options.weight_decay,
        "lr_scheduler_type": "linear",
        "seed": options.seed,
        "data_seed": options.seed,
        "eval_strategy": "epoch" if per_epoch else "steps",
        "save_strategy": "epoch" if per_epoch else "steps",
        **({} if per_epoch else {"eval_steps": options.max_steps, "save_steps": options.max_steps}),
        "load_best_model_at_end": True,
        "metric_for_best_model": VALIDATION_METRIC,
        "greater_is_better": True,
        # The best checkpoint and the latest (to resume from) are all that is kept.
        "save_total_limit": 2,
        "logging_steps": 5,
        "logging_first_step": True,
        "report_to": "none",
        "disable_tqdm": not options.progress,
        "dataloader_num_workers": 0,
        "use_cpu": not cuda,
        "bf16": bf16,
        "fp16": cuda and not bf16,
        **extra,
    }


def _cuda_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def last_checkpoint(options: FinetuneOptions) -> str | None:
    """The newest checkpoint of an interrupted run, to resume from."""
    from transformers.trainer_utils import get_last_checkpoint

    folder = options.output / CHECKPOINTS
    if not folder.is_dir():
        return None
    found: str | None = get_last_checkpoint(str(folder))  # type: ignore[no-untyped-call]
    return found


@dataclass(frozen=True)
class TrainingOutcome:
    """What the report needs from a finished trainer."""

    log_history: list[dict[str, Any]]
    best_checkpoint: str | None
    baseline: dict[str, float]
    seconds: float
    examples: int
    details: dict[str, Any]


@dataclass(frozen=True)
class OpenedRun:
    """A run folder claimed for one role, with its training data fixed."""

    dataset: BeirDataset
    data: TrainingData
    #: Document id → the text both models see (`title text`).
    texts: dict[str, str]
    device: str


def open_run(role: str, options: FinetuneOptions, settings: Settings) -> OpenedRun | None:
    """Start or resume the run in `--output`, split the queries and mine negatives with the
    configured embedder, and seed everything. None when the folder holds a finished run."""
    from transformers import set_seed

    if not start_run(role, options):
        print(
            f"{options.output} holds a finished run; its model is {options.output / MODEL_FOLDER}"
        )
        return None
    dataset, held_out = load_dataset(options)
    data = saved_data(options) or prepare_data(
        dataset, held_out, SentenceTransformerEmbedder.from_settings(settings), options
    )
    set_seed(options.seed)
    return OpenedRun(
        dataset=dataset,
        data=data,
        texts={doc_id: doc.passage for doc_id, doc in dataset.corpus.items()},
        device=resolve_placement(settings.device, settings.dtype).device,
    )


def train_and_report(
    role: str,
    run: OpenedRun,
    options: FinetuneOptions,
    *,
    trainer: Any,
    baseline: dict[str, float],
    examples: int,
    details: dict[str, Any],
) -> Path:
    """Train (from the latest checkpoint, if any), save the kept model and write the report."""
    model_folder = options.output / MODEL_FOLDER
    seconds = timed(lambda: trainer.train(resume_from_checkpoint=last_checkpoint(options)))
    trainer.model.save_pretrained(str(model_folder))
    outcome = TrainingOutcome(
        log_history=list(trainer.state.log_history),
        best_checkpoint=trainer.state.best_model_checkpoint,
        baseline=baseline,
        seconds=add_seconds(options, seconds),
        examples=examples,
        details=details,
    )
    for path in write_report(
        role,
        options=options,
        dataset=run.dataset,
        data=run.data,
        outcome=outcome,
        device=run.device,
    ):
        print(f"wrote {path}")
    setting = env_name("rerank_model" if role == "reranker" else "embed_model")
    print(f"model: {model_folder} (serve it with {setting}={model_folder})")
    return model_folder


def add_seconds(options: FinetuneOptions, seconds: float) -> float:
    """Training time over every invocation of this run (a resumed run adds to it)."""
    path = options.output / "seconds.json"
    total = seconds
    if path.exists():
        total += float(json.loads(path.read_text(encoding="utf-8"))["seconds"])
    _write_json(path, {"seconds": total})
    return total


def baseline_metrics(
    options: FinetuneOptions, validation: ValidationNdcg, model: Any
) -> dict[str, float]:
    """Validation metrics of the starting model, measured once per run."""
    path = options.output / "baseline.json"
    if path.exists():
        stored: dict[str, float] = json.loads(path.read_text(encoding="utf-8"))
        return stored
    metrics = validation(model)
    _write_json(path, metrics)
    return metrics


def write_report(
    role: str,
    *,
    options: FinetuneOptions,
    dataset: BeirDataset,
    data: TrainingData,
    outcome: TrainingOutcome,
    device: str,
) -> list[Path]:
    """report.json, report.md and training.png (loss by step, validation NDCG@10 by epoch)."""
    losses = [
        {"step": int(entry["step"]), "epoch": float(entry["epoch"]), "loss": float(entry["loss"])}
        for entry in outcome.log_history
        if "loss" in entry
    ]
    epochs = [
        {
            "epoch": float(entry["epoch"]),
            "step": int(entry["step"]),
            **{
                key.removeprefix("eval_"): float(value)
                for key, value in entry.items()
                if key.startswith("eval_val_")
            },
        }
        for entry in outcome.log_history
        if VALIDATION_METRIC in entry
    ]
    model_folder = options.output / MODEL_FOLDER
    best = max(epochs, key=lambda e: e["val_ndcg@10"]) if epochs else None
    report = {
        "role": role,
        "dataset": dataset.name,
        "dataset_checksums": dict(dataset.checksums),
        "options": options.recorded(),
        "device": device,
        "queries": {
            "train": len(data.split.train),
            "validation": len(data.split.validation),
            "held_out_dropped": len(data.split.held_out),
        },
        "mining_model": data.mining_model,
        "negatives_per_query": float(np.mean([len(v) for v in data.negatives.values()])),
        "training_examples": outcome.examples,
        "training_seconds": round(outcome.seconds, 1),
        "validation_before": outcome.baseline,
        "validation_by_epoch": epochs,
        "best": best,
        "best_checkpoint": outcome.best_checkpoint,
        "loss": losses,
        "model": str(model_folder),
        **outcome.details,
    }
    paths = [options.output / "report.json", options.output / "report.md"]
    _write_json(paths[0], report)
    paths[1].write_text(_markdown(report), encoding="utf-8")
    plot = options.output / "training.png"
    _plot(losses, epochs, outcome.baseline, plot, role)
    paths.append(plot)
    return paths


def _markdown(report: Mapping[str, Any]) -> str:
    setting = "RAGRANK_RERANK_MODEL" if report["role"] == "reranker" else "RAGRANK_EMBED_MODEL"
    queries = report["queries"]
    lines = [
        f"# Fine-tuned {report['role']}: {report['dataset']}",
        "",
        f"- Started from `{report['options']['base']}`"
        + (f" ({report['head']} head)" if "head" in report else ""),
        f"- Queries: {queries['train']} train, {queries['validation']} validation; "
        f"{queries['held_out_dropped']} dropped because the held-out split "
        f"`{report['options']['held_out_split']}` judges them",
        f"- {report['training_examples']:,} training examples, "
        f"{report['negatives_per_query']:.1f} mined negatives per query "
        f"(from `{report['mining_model']}`)",
        f"- Training time: {report['training_seconds'] / 60:.1f} min on {report['device']}",
        "",
        "| epoch | validation NDCG@10 | Recall@10 | MRR@10 |",
        "| ---: | ---: | ---: | ---: |",
        "| 0 (start) | {:.4f} | {:.4f} | {:.4f} |".format(
            *(report["validation_before"][f"val_{m}"] for m in ("ndcg@10", "recall@10", "mrr@10"))
        ),
    ]
    if "validation_first_stage" in report:
        lines.append(
            "| first stage (cosine order) | {:.4f} | {:.4f} | {:.4f} |".format(
                *(
                    report["validation_first_stage"][f"val_{m}"]
                    for m in ("ndcg@10", "recall@10", "mrr@10")
                )
            )
        )
    lines += [
        "| {:.2f} | {:.4f} | {:.4f} | {:.4f} |".format(
            e["epoch"], e["val_ndcg@10"], e["val_recall@10"], e["val_mrr@10"]
        )
        for e in report["validation_by_epoch"]
    ]
    best = report["best"]
    lines += [
        "",
        f"Kept: the checkpoint of epoch {best['epoch']:.2f} (validation NDCG@10 "
        f"{best['val_ndcg@10']:.4f}), saved to `{report['model']}`."
        if best
        else "No validation pass ran; the model is the last step's.",
        "",
        f"Serve it with `{setting}={report['model']}`; measure it on the held-out split with "
        f"`{_eval_command(report)}`.",
        "",
        "![loss and validation NDCG@10](training.png)",
        "",
    ]
    return "\n".join(lines)


def _eval_command(report: Mapping[str, Any]) -> str:
    """The `ragrank eval` that compares the fine-tuned model with what it replaces."""
    options = report["options"]
    command = f"ragrank eval --dataset {options['dataset']} --split {options['held_out_split']}"
    if report["role"] == "reranker":
        return f"RAGRANK_RERANK_MODEL={report['model']} {command} --systems cosine,reranked"
    return (
        f"{command} --systems cosine --embed-model {report['model']} "
        f"--baseline-embed-model {options['base']}"
    )


def _plot(
    losses: list[dict[str, Any]],
    epochs: list[dict[str, Any]],
    baseline: Mapping[str, float],
    path: Path,
    role: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot([e["epoch"] for e in losses], [e["loss"] for e in losses], marker=".")
    left.set(xlabel="epoch", ylabel="training loss", title=f"{role}: training loss")
    xs = [0.0, *(e["epoch"] for e in epochs)]
    ys = [baseline["val_ndcg@10"], *(e["val_ndcg@10"] for e in epochs)]
    right.plot(xs, ys, marker="o")
    right.set(xlabel="epoch", ylabel="NDCG@10", title="validation NDCG@10")
    for axis in (left, right):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
