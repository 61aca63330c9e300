"""The report of a fine-tuning run: report.json, report.md and a plot of the training loss
and validation NDCG@10."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from eval.finetune.data import MODEL_FOLDER, VALIDATION_METRIC, TrainingData, write_json
from ragrank.roles import RERANK, role_named
from ragrank.settings import env_name

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from eval.options import FinetuneOptions
    from ragrank.beir import BeirDataset


@dataclass(frozen=True)
class TrainingOutcome:
    """What the report needs from a finished trainer."""

    log_history: list[dict[str, Any]]
    best_checkpoint: str | None
    baseline: dict[str, float]
    seconds: float
    examples: int
    details: dict[str, Any]


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
        "miner": data.miner,
        "split_groups": data.groups,
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
    write_json(paths[0], report)
    paths[1].write_text(_markdown(report), encoding="utf-8")
    plot = options.output / "training.png"
    _plot(losses, epochs, outcome.baseline, plot, role)
    paths.append(plot)
    return paths


def _markdown(report: Mapping[str, Any]) -> str:
    setting = env_name(role_named(report["role"]).setting("model"))
    queries = report["queries"]
    lines = [
        f"# Fine-tuned {report['role']}: {report['dataset']}",
        "",
        f"- Started from `{report['options']['base']}`"
        + (f" ({report['head']} head)" if "head" in report else ""),
        f"- Queries: {queries['train']} train, {queries['validation']} validation; "
        + _held_out(report),
        f"- {report['training_examples']:,} training examples, "
        f"{report['negatives_per_query']:.1f} mined negatives per query "
        f"(from the {report.get('miner', 'cosine')} first stage of `{report['mining_model']}`)",
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
            "| first stage ({} order) | {:.4f} | {:.4f} | {:.4f} |".format(
                report.get("miner", "cosine"),
                *(
                    report["validation_first_stage"][f"val_{m}"]
                    for m in ("ndcg@10", "recall@10", "mrr@10")
                ),
            )
        )
    lines += [
        "| {:.2f} | {:.4f} | {:.4f} | {:.4f} |".format(
            e["epoch"], e["val_ndcg@10"], e["val_recall@10"], e["val_mrr@10"]
        )
        for e in report["validation_by_epoch"]
    ]
    best = report["best"]
    calibration = report.get("calibration")
    if calibration:
        lines += [
            "",
            f"Calibration (Platt, on {calibration['pairs']:,} validation pairs): "
            f"sigmoid({calibration['a']:.3f}·logit {calibration['b']:+.3f}); expected "
            f"calibration error {calibration['ece_sigmoid']:.3f} (plain sigmoid) → "
            f"{calibration['ece_calibrated']:.3f}.",
        ]
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


def _held_out(report: Mapping[str, Any]) -> str:
    """Which queries training never saw, in words."""
    options, queries = report["options"], report["queries"]
    groups = report.get("split_groups")
    if groups:
        sides = groups["groups"]
        return (
            f"{queries['held_out_dropped']} test queries held out by `{groups['field']}` "
            f"(seed {groups['seed']}: {len(sides['train'])} values train, "
            f"{len(sides['validation'])} validate, {len(sides['test'])} test)"
        )
    return (
        f"{queries['held_out_dropped']} dropped because the held-out split "
        f"`{options['held_out_split']}` judges them"
    )


def _eval_command(report: Mapping[str, Any]) -> str:
    """The `ragrank eval` that compares the fine-tuned model with what it replaces."""
    options = report["options"]
    if options.get("split_by"):
        folders = " ".join(options["merge"]) if options.get("merge") else options["dataset"]
        flag = "--merge" if options.get("merge") else "--dataset"
        command = (
            f"ragrank eval {flag} {folders} --split {options['split']} --split-by "
            f"{options['split_by']} --split-seed {options['split_seed']} --test-share "
            f"{options['test_share']}"
        )
    else:
        command = f"ragrank eval --dataset {options['dataset']} --split {options['held_out_split']}"
    if report["role"] == RERANK.trainee:
        setting = env_name(RERANK.setting("model"))
        systems = (
            "hybrid,hybrid-reranked --versus hybrid"
            if options.get("split_by")
            else ("cosine,reranked")
        )
        return f"{setting}={report['model']} {command} --systems {systems}"
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
