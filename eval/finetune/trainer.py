"""The trainer's side of fine-tuning: claiming or resuming a run folder, validation NDCG@10 as
a sentence-transformers evaluator, the trainer's arguments, and training to the saved model."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sentence_transformers.base.evaluation.evaluator import BaseEvaluator

from eval.command import store_factory
from eval.finetune.data import (
    CHECKPOINTS,
    MODEL_FOLDER,
    RUN_FILE,
    VALIDATION_METRIC,
    Miner,
    TrainingData,
    load_dataset,
    prepare_data,
    read_unlabelled,
    saved_data,
    write_json,
)
from eval.finetune.report import TrainingOutcome, write_report
from eval.metrics import Run, score_run
from ragrank.backends.serving import load_inference
from ragrank.device import resolve_placement
from ragrank.errors import SettingsError
from ragrank.roles import role_named
from ragrank.settings import Settings, env_name
from ragrank.sparse import sparse_encoder
from ragrank.store import sparse_stamp

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from eval.options import FinetuneOptions
    from ragrank.beir import BeirDataset

log = logging.getLogger(__name__)


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
        write_json(path, record)
    return True


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


def planned_steps(options: FinetuneOptions, examples: int) -> int:
    """The optimiser steps the trainer will take: `--max-steps`, else every epoch's batches
    (one device, no gradient accumulation)."""
    if options.max_steps is not None:
        return options.max_steps
    return max(1, math.ceil(options.epochs * math.ceil(examples / options.batch_size)))


def warmup_steps(options: FinetuneOptions, examples: int) -> int:
    """`--warmup-ratio` as a step count. transformers reads a float `warmup_steps` below 1 as a
    ratio only from version 5 on, and dropped `warmup_ratio`; a count means the same to all."""
    return math.ceil(options.warmup_ratio * planned_steps(options, examples))


def training_arguments(
    options: FinetuneOptions, device: str, examples: int, **extra: Any
) -> dict[str, Any]:
    """Keyword arguments for sentence-transformers' TrainingArguments: linear schedule with
    warm-up, AdamW with weight decay, a checkpoint and a validation pass per epoch (every
    `max_steps` steps for a capped run), and the best checkpoint by validation NDCG@10.
    `examples` is the training set's size, which the warm-up's length depends on."""
    per_epoch = options.max_steps is None and options.eval_every is None
    every = options.eval_every or options.max_steps
    cuda = device.startswith("cuda")
    bf16 = cuda and _cuda_bf16()
    return {
        "output_dir": str(options.output / CHECKPOINTS),
        "num_train_epochs": options.epochs,
        "max_steps": options.max_steps or -1,
        "per_device_train_batch_size": options.batch_size,
        "per_device_eval_batch_size": options.batch_size,
        "learning_rate": options.learning_rate,
        "warmup_steps": warmup_steps(options, examples),
        "weight_decay": options.weight_decay,
        "lr_scheduler_type": "linear",
        "seed": options.seed,
        "data_seed": options.seed,
        "eval_strategy": "epoch" if per_epoch else "steps",
        "save_strategy": "epoch" if per_epoch else "steps",
        **({} if per_epoch else {"eval_steps": every, "save_steps": every}),
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
    data = saved_data(options)
    if data is None:
        inference = load_inference(settings, rerankers=False, offline=True)
        sparse = sparse_encoder(settings) if options.mine_with == "hybrid" else None
        if options.mine_with == "hybrid" and sparse is None:
            raise SettingsError(
                "--mine-with hybrid needs BM25 (RAGRANK_SPARSE is none); use --mine-with cosine"
            )
        with inference.running():
            miner = Miner(
                inference.bulk_embedder(),
                sparse=sparse,
                open_store=store_factory(settings, sparse_stamp(sparse)),
                fusion=settings,
            )
            unlabelled = read_unlabelled(options.unlabelled_queries)
            data = prepare_data(dataset, held_out, miner, options, unlabelled=unlabelled)
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
    finish: Callable[[Any], dict[str, Any]] | None = None,
) -> Path:
    """Train (from the latest checkpoint, if any), save the kept model and write the report.
    `finish` runs on the kept model once it is saved (a reranker's calibration) and adds to
    the report."""
    model_folder = options.output / MODEL_FOLDER
    seconds = timed(lambda: trainer.train(resume_from_checkpoint=last_checkpoint(options)))
    trainer.model.save_pretrained(str(model_folder))
    if finish is not None:
        details = {**details, **finish(trainer.model)}
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
    setting = env_name(role_named(role).setting("model"))
    print(f"model: {model_folder} (serve it with {setting}={model_folder})")
    return model_folder


def add_seconds(options: FinetuneOptions, seconds: float) -> float:
    """Training time over every invocation of this run (a resumed run adds to it)."""
    path = options.output / "seconds.json"
    total = seconds
    if path.exists():
        total += float(json.loads(path.read_text(encoding="utf-8"))["seconds"])
    write_json(path, {"seconds": total})
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
    write_json(path, metrics)
    return metrics


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start
