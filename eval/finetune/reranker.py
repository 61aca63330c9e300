"""`ragrank finetune reranker`: train a one-logit cross-encoder on a collection's qrels and
hard negatives mined by the configured embedder, keeping the best checkpoint by validation
NDCG@10. The saved folder is what `RAGRANK_RERANK_MODEL` points at."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from eval.finetune.data import MODEL_FOLDER, TrainingData, positives
from eval.finetune.trainer import (
    ValidationNdcg,
    baseline_metrics,
    open_run,
    train_and_report,
    training_arguments,
)
from eval.metrics import Run, score_run
from ragrank.errors import ModelLoadError
from ragrank.loading import load_model
from ragrank.roles import RERANK
from ragrank.settings import Settings, env_name

if TYPE_CHECKING:
    from pathlib import Path

    from eval.options import FinetuneOptions

log = logging.getLogger(__name__)

RERANKER_LOSSES = ("bce", "listnet")


def finetune_reranker(settings: Settings, options: FinetuneOptions) -> Path:
    """Run (or resume) one fine-tuning run; returns the saved model folder."""
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss, ListNetLoss

    if options.loss not in RERANKER_LOSSES:
        raise ModelLoadError(f"--loss {options.loss!r}: a reranker trains with bce or listnet")
    options = replace(options, base=options.base or settings.rerank_model)
    run = open_run(RERANK.trainee, options, settings)
    if run is None:
        return options.output / MODEL_FOLDER
    dataset, data = run.dataset, run.data
    encoder, head = load_base(str(options.base), options.max_length, run.device)
    validation = ValidationNdcg(
        lambda model: _rerank(model, dataset.queries, run.texts, data, options),
        {qid: dataset.qrels[qid] for qid in data.split.validation},
    )
    baseline = baseline_metrics(options, validation, encoder)
    rows, positive_count, negative_count = training_rows(
        dataset.queries, dataset.qrels, run.texts, data, options
    )
    if options.loss == "bce":
        # Weighting positives by the negative:positive ratio keeps the loss from being won
        # by always answering "irrelevant".
        ratio = negative_count / max(positive_count, 1)
        loss: Any = BinaryCrossEntropyLoss(encoder, pos_weight=torch.tensor(ratio))
    else:
        loss = ListNetLoss(encoder)
    examples = len(next(iter(rows.values())))
    trainer = CrossEncoderTrainer(
        model=encoder,
        args=CrossEncoderTrainingArguments(**training_arguments(options, run.device, examples)),
        train_dataset=Dataset.from_dict(rows),
        loss=loss,
        evaluator=validation,
    )
    return train_and_report(
        RERANK.trainee,
        run,
        options,
        trainer=trainer,
        baseline=baseline,
        examples=examples,
        details={
            "validation_first_stage": _first_stage(validation, data),
            "head": head,
            "loss_function": options.loss,
            "positives": positive_count,
            "negatives": negative_count,
        },
    )


def load_base(base: str, max_length: int, device: str) -> tuple[Any, str]:
    """A trainable CrossEncoder from a one-logit cross-encoder ("trained" head) or from a plain
    encoder checkpoint, e.g. a sentence-transformers bi-encoder ("fresh" head: one randomly
    initialised logit)."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoConfig

    def loader(source: str) -> tuple[Any, str]:
        config = AutoConfig.from_pretrained(source)
        classifier = any(
            name.endswith("ForSequenceClassification") for name in config.architectures or []
        )
        if classifier and config.num_labels != 1:
            raise ValueError(
                f"it is a classifier with {config.num_labels} labels, not a one-logit "
                "cross-encoder or a plain encoder"
            )
        encoder = CrossEncoder(source, num_labels=1, max_length=max_length, device=device)
        return encoder, "trained" if classifier else "fresh"

    loaded: tuple[Any, str] = load_model(
        RERANK.label, base, f"--base (default {env_name(RERANK.setting('model'))})", loader
    )
    return loaded


def training_rows(
    queries: dict[str, str] | Any,
    qrels: Any,
    texts: dict[str, str],
    data: TrainingData,
    options: FinetuneOptions,
) -> tuple[dict[str, list[Any]], int, int]:
    """Training rows of the train queries only: (query, passage, label) pairs for BCE, or one
    (query, documents, labels) list per query for ListNet."""
    pairs: dict[str, list[Any]] = {"query": [], "passage": [], "label": []}
    lists: dict[str, list[Any]] = {"query": [], "docs": [], "labels": []}
    positive_count = negative_count = 0
    for qid in data.split.train:
        relevant = sorted(positives(qrels, qid))
        negatives = data.negatives[qid]
        positive_count += len(relevant)
        negative_count += len(negatives)
        labelled = [(doc_id, 1.0) for doc_id in relevant] + [(doc_id, 0.0) for doc_id in negatives]
        for doc_id, label in labelled:
            pairs["query"].append(queries[qid])
            pairs["passage"].append(texts[doc_id])
            pairs["label"].append(label)
        lists["query"].append(queries[qid])
        lists["docs"].append([texts[doc_id] for doc_id, _ in labelled])
        lists["labels"].append([label for _, label in labelled])
    return (pairs if options.loss == "bce" else lists), positive_count, negative_count


def _first_stage(validation: ValidationNdcg, data: TrainingData) -> dict[str, float]:
    """Validation metrics of the candidates in their cosine order: what reranking must beat."""
    run = {
        qid: {doc_id: -float(rank) for rank, doc_id in enumerate(docs)}
        for qid, docs in data.validation_candidates.items()
    }
    scores = score_run(validation.qrels, run, "cosine")
    return {f"val_{metric}": scores.means[metric] for metric in ("ndcg@10", "recall@10", "mrr@10")}


def _rerank(
    model: Any,
    queries: Any,
    texts: dict[str, str],
    data: TrainingData,
    options: FinetuneOptions,
) -> Run:
    """Validation run: each validation query's cosine candidates ordered by the model."""
    owners = [(qid, doc_id) for qid, docs in data.validation_candidates.items() for doc_id in docs]
    scores = model.predict(
        [(queries[qid], texts[doc_id]) for qid, doc_id in owners],
        batch_size=options.batch_size * 2,
        show_progress_bar=False,
    )
    run: dict[str, dict[str, float]] = {qid: {} for qid in data.validation_candidates}
    for (qid, doc_id), score in zip(owners, scores.tolist(), strict=True):
        run[qid][doc_id] = float(score)
    return run
