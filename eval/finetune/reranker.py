"""`ragrank finetune reranker`: train a one-logit cross-encoder on a collection's qrels and
hard negatives mined by the configured embedder, keeping the best checkpoint by validation
NDCG@10. The saved folder is what `RAGRANK_RERANK_MODEL` points at."""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from eval.finetune.data import MODEL_FOLDER, TrainingData, positives, write_json
from eval.finetune.trainer import (
    OpenedRun,
    ValidationNdcg,
    baseline_metrics,
    open_run,
    train_and_report,
    training_arguments,
)
from eval.metrics import Run, score_run
from ragrank.errors import ModelLoadError, SettingsError
from ragrank.loading import load_model
from ragrank.roles import RERANK
from ragrank.settings import Settings, env_name

if TYPE_CHECKING:
    from pathlib import Path

    from eval.options import FinetuneOptions

log = logging.getLogger(__name__)

RERANKER_LOSSES = ("bce", "listnet", "lce")
#: The teacher's logits of a distillation run, kept for a resume.
TEACHER_SCORES = "teacher-scores.json"
#: The parameters of a sequence-classification head (BERT's pooler and classifier, XLM-R's
#: classification head), by name.
HEAD_PARAMETERS = r".*\.(pooler|classifier)\..*"


def finetune_reranker(settings: Settings, options: FinetuneOptions) -> Path:
    """Run (or resume) one fine-tuning run; returns the saved model folder."""
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import (
        BinaryCrossEntropyLoss,
        ListNetLoss,
    )

    if options.loss not in RERANKER_LOSSES:
        raise ModelLoadError(
            f"--loss {options.loss!r}: a reranker trains with {', '.join(RERANKER_LOSSES)}"
        )
    options = replace(options, base=options.base or settings.rerank_model)
    run = open_run(RERANK.trainee, options, settings)
    if run is None:
        return options.output / MODEL_FOLDER
    if options.teacher is not None:
        return distil(run, options)
    dataset, data = run.dataset, run.data
    encoder, head, validation, baseline = _start(run, options)
    rows, positive_count, negative_count = training_rows(
        dataset.queries, dataset.qrels, run.texts, data, options
    )
    if options.loss == "bce":
        # Weighting positives by the negative:positive ratio keeps the loss from being won
        # by always answering "irrelevant".
        ratio = negative_count / max(positive_count, 1)
        loss: Any = BinaryCrossEntropyLoss(encoder, pos_weight=torch.tensor(ratio))
    elif options.loss == "listnet":
        loss = ListNetLoss(encoder)
    else:
        # Localised contrastive estimation: softmax cross-entropy of each query's positive
        # against its own hard negatives (no in-batch ones), on the raw logits.
        loss = lce_loss(encoder)
    examples = len(next(iter(rows.values())))
    trainer = CrossEncoderTrainer(
        model=encoder,
        args=CrossEncoderTrainingArguments(
            **training_arguments(options, run.device, examples, **head_rates(options))
        ),
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
        finish=lambda model: calibrate(model, run, options),
        details={
            "validation_first_stage": _first_stage(validation, data),
            "head": head,
            "loss_function": options.loss,
            "positives": positive_count,
            "negatives": negative_count,
        },
    )


def load_base(
    base: str,
    max_length: int,
    device: str,
    *,
    layers: int | None = None,
    freeze_embeddings: bool = False,
) -> tuple[Any, str]:
    """A trainable CrossEncoder from a one-logit cross-encoder ("trained" head) or from a plain
    encoder checkpoint, e.g. a sentence-transformers bi-encoder ("fresh" head: one randomly
    initialised logit). `layers` keeps the first N transformer layers (a student);
    `freeze_embeddings` fixes the token embedding table."""
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
    encoder, _ = loaded
    if layers is not None:
        keep_layers(encoder.model, layers)
    if freeze_embeddings:
        encoder.model.get_input_embeddings().weight.requires_grad_(False)
    return loaded


def keep_layers(model: Any, layers: int) -> None:
    """Cut a BERT-like encoder to its first `layers` transformer layers, in place, and say so
    in its config so that the saved folder loads as the shallower model."""
    stack = getattr(getattr(model.base_model, "encoder", None), "layer", None)
    if stack is None:
        raise SettingsError(f"--layers: {type(model).__name__} has no encoder.layer stack to cut")
    if layers > len(stack):
        raise SettingsError(f"--layers {layers}: the base has only {len(stack)} layers")
    del stack[layers:]
    model.config.num_hidden_layers = layers


def training_rows(
    queries: dict[str, str] | Any,
    qrels: Any,
    texts: dict[str, str],
    data: TrainingData,
    options: FinetuneOptions,
) -> tuple[dict[str, list[Any]], int, int]:
    """Training rows of the train queries only: (query, passage, label) pairs for BCE, one
    (query, documents, labels) list per query for ListNet, or for LCE one (query, positive,
    negative 1 … n) row per query with all its negatives (a query with fewer is left out)."""
    pairs: dict[str, list[Any]] = {"query": [], "passage": [], "label": []}
    lists: dict[str, list[Any]] = {"query": [], "docs": [], "labels": []}
    rows: dict[str, list[Any]] = {"query": [], "positive": []}
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
        if relevant and len(negatives) >= options.negatives:
            rows["query"].append(queries[qid])
            rows["positive"].append(texts[relevant[0]])
            for column, doc_id in enumerate(negatives[: options.negatives]):
                rows.setdefault(f"negative_{column + 1}", []).append(texts[doc_id])
    if options.loss == "lce":
        rows["label"] = [0] * len(rows["query"])  # the positive is column 0
        return rows, len(rows["query"]), len(rows["query"]) * options.negatives
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
    """Validation run: each validation query's first-stage candidates with the model's
    logits (raw: the calibration is fitted on them)."""
    owners = [(qid, doc_id) for qid, docs in data.validation_candidates.items() for doc_id in docs]
    scores = model.predict(
        [(queries[qid], texts[doc_id]) for qid, doc_id in owners],
        batch_size=options.batch_size * 2,
        show_progress_bar=False,
        activation_fn=identity(),
    )
    run: dict[str, dict[str, float]] = {qid: {} for qid in data.validation_candidates}
    for (qid, doc_id), score in zip(owners, scores.tolist(), strict=True):
        run[qid][doc_id] = float(score)
    return run


def _start(run: OpenedRun, options: FinetuneOptions) -> tuple[Any, str, ValidationNdcg, Any]:
    """The model to train (its head fresh or trained), its validation on the first stage's
    candidates, and the starting model's validation metrics."""
    encoder, head = load_base(
        str(options.base),
        options.max_length,
        run.device,
        layers=options.layers,
        freeze_embeddings=options.freeze_embeddings,
    )
    dataset, data = run.dataset, run.data
    validation = ValidationNdcg(
        lambda model: _rerank(model, dataset.queries, run.texts, data, options),
        {qid: dataset.qrels[qid] for qid in data.split.validation},
    )
    return encoder, head, validation, baseline_metrics(options, validation, encoder)


def head_rates(options: FinetuneOptions) -> dict[str, Any]:
    """The trainer's learning rate of a fresh head, when `--head-learning-rate` sets one: a
    fresh head starts from nothing and may learn faster than the encoder below it."""
    if options.head_learning_rate is None:
        return {}
    return {"learning_rate_mapping": {HEAD_PARAMETERS: options.head_learning_rate}}


def calibrate(model: Any, run: OpenedRun, options: FinetuneOptions) -> dict[str, Any]:
    """Fit Platt scaling to the kept model's logits on the validation queries' candidates,
    save it in the model folder (the server applies it) and return it for the report, with
    the expected calibration error before (plain sigmoid) and after on the same pairs."""
    from eval.calibration import expected_calibration_error, fit_platt, labelled_pairs
    from ragrank.calibration import probabilities, write_calibration

    logits = _rerank(model, run.dataset.queries, run.texts, run.data, options)
    qrels = {qid: run.dataset.qrels[qid] for qid in run.data.split.validation}
    values, labels = labelled_pairs(qrels, logits)
    fitted_on = f"{len(values)} validation pairs of {len(logits)} queries ({run.dataset.name})"
    calibration = fit_platt(values, labels, fitted_on)
    details = {
        "pairs": len(values),
        "ece_sigmoid": expected_calibration_error(probabilities(values, None), labels),
        "ece_calibrated": expected_calibration_error(probabilities(values, calibration), labels),
    }
    write_calibration(options.output / MODEL_FOLDER, calibration, details)
    return {"calibration": {"a": calibration.a, "b": calibration.b, **details}}


def distil(run: OpenedRun, options: FinetuneOptions) -> Path:
    """`--teacher`: the student learns the teacher's logits on each training query's mined
    candidates (margin MSE on (first, other) differences, or MSE on the logits), with the
    labelled loss mixed in by `--label-weight`."""
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import (
        BinaryCrossEntropyLoss,
        MarginMSELoss,
        MSELoss,
    )

    dataset, data = run.dataset, run.data
    encoder, head, validation, baseline = _start(run, options)
    lists = distillation_lists(run, options)
    scores = teacher_scores(lists, run, options)
    rows = distillation_rows(lists, scores, run, options.distil_loss)
    loss: Any = MarginMSELoss(encoder) if options.distil_loss == "margin-mse" else MSELoss(encoder)
    examples = len(next(iter(rows.values())))
    train: Any = Dataset.from_dict(rows)
    losses: Any = loss
    labelled = 0
    if options.label_weight > 0:
        pairs = {"query": [], "passage": [], "label": []}  # type: dict[str, list[Any]]
        for qid in data.split.train:
            for doc_id in lists.get(qid, ()):
                pairs["query"].append(dataset.queries[qid])
                pairs["passage"].append(run.texts[doc_id])
                pairs["label"].append(float(doc_id in positives(dataset.qrels, qid)))
        labelled = len(pairs["label"])
        train = {"teacher": train, "labels": Dataset.from_dict(pairs)}
        losses = {
            "teacher": loss,
            "labels": weighted(BinaryCrossEntropyLoss(encoder), options.label_weight),
        }
        examples += labelled
    trainer = CrossEncoderTrainer(
        model=encoder,
        args=CrossEncoderTrainingArguments(
            **training_arguments(options, run.device, examples, **head_rates(options))
        ),
        train_dataset=train,
        loss=losses,
        evaluator=validation,
    )
    return train_and_report(
        RERANK.trainee,
        run,
        options,
        trainer=trainer,
        baseline=baseline,
        examples=examples,
        finish=lambda model: calibrate(model, run, options),
        details={
            "validation_first_stage": _first_stage(validation, data),
            "head": head,
            "loss_function": f"distillation ({options.distil_loss})",
            "teacher": options.teacher,
            "distilled_queries": len(lists),
            "unlabelled_queries": len(data.unlabelled or {}),
            "labelled_pairs_mixed": labelled,
            "layers": options.layers,
        },
    )


def distillation_lists(run: OpenedRun, options: FinetuneOptions) -> dict[str, list[str]]:
    """Each distilled query's documents, `--negatives` + 1 of them: a labelled query's first
    positive and its mined negatives; an unlabelled query's first-stage top. Queries with
    fewer are left out (margin MSE needs as many columns in every row). A run capped by
    `--max-steps` distils a seeded sample of as many queries as its steps take, so that the
    teacher scores no pair the student never sees."""
    data, qrels = run.data, run.dataset.qrels
    width = options.negatives + 1
    lists: dict[str, list[str]] = {}
    for qid in data.split.train:
        relevant = sorted(positives(qrels, qid))
        docs = relevant[:1] + data.negatives.get(qid, [])
        if len(docs) >= width:
            lists[qid] = docs[:width]
    for qid in data.unlabelled or {}:
        docs = (data.train_candidates or {}).get(qid, [])
        if len(docs) >= width:
            lists[qid] = docs[:width]
    room = options.max_steps * options.batch_size if options.max_steps else len(lists)
    if room < len(lists):
        # A seeded order cut at `room`: a longer run's sample holds a shorter one's, whose
        # teacher scores it reuses.
        order = sorted(lists)
        random.Random(options.seed).shuffle(order)
        kept = set(order[:room])
        lists = {qid: docs for qid, docs in lists.items() if qid in kept}
    return lists


def teacher_scores(
    lists: dict[str, list[str]], run: OpenedRun, options: FinetuneOptions
) -> dict[str, list[float]]:
    """The teacher's logit of every (query, document) to distil, kept in the run folder
    (`teacher-scores.json`, each query's documents with their logits): a resumed run, one with
    more steps or one with more `--negatives` scores only the pairs it has not scored yet."""
    import json

    from sentence_transformers import CrossEncoder

    path = options.output / TEACHER_SCORES
    known = known_logits(json.loads(path.read_text(encoding="utf-8")) if path.exists() else {})
    missing = [
        (qid, doc_id) for qid, docs in lists.items() for doc_id in docs if doc_id not in known[qid]
    ]
    if missing:
        teacher = load_model(
            RERANK.label,
            str(options.teacher),
            "--teacher",
            lambda source: CrossEncoder(source, max_length=options.max_length, device=run.device),
        )
        texts = query_texts(run)
        logits = teacher.predict(
            [(texts[qid], run.texts[doc_id]) for qid, doc_id in missing],
            batch_size=options.batch_size * 4,
            show_progress_bar=options.progress,
            activation_fn=identity(),
        )
        for (qid, doc_id), logit in zip(missing, logits.tolist(), strict=True):
            known[qid][doc_id] = float(logit)
        stored = {
            qid: {"documents": list(by_doc), "logits": list(by_doc.values())}
            for qid, by_doc in known.items()
        }
        write_json(path, stored)
    return {qid: [known[qid][doc_id] for doc_id in docs] for qid, docs in lists.items()}


def known_logits(stored: dict[str, Any]) -> defaultdict[str, dict[str, float]]:
    """`teacher-scores.json`'s logits by query and document. An entry without its documents
    (a bare list of logits, as earlier versions wrote) is dropped, to be scored again rather
    than trusted."""
    known: defaultdict[str, dict[str, float]] = defaultdict(dict)
    for qid, entry in stored.items():
        if isinstance(entry, dict) and len(entry.get("documents", ())) == len(
            entry.get("logits", ())
        ):
            known[qid] = {
                str(doc): float(logit)
                for doc, logit in zip(entry["documents"], entry["logits"], strict=True)
            }
    return known


def query_texts(run: OpenedRun) -> dict[str, str]:
    """Every query's text: the collection's and the unlabelled ones."""
    return {**run.dataset.queries, **(run.data.unlabelled or {})}


def distillation_rows(
    lists: dict[str, list[str]],
    scores: dict[str, list[float]],
    run: OpenedRun,
    loss: str,
) -> dict[str, list[Any]]:
    """Margin MSE: one row per query, (query, document 1 … n) with the teacher's n logits
    (the loss takes the first's differences to the others). MSE: one (query, document,
    logit) row per pair."""
    texts = query_texts(run)
    if loss == "mse":
        rows: dict[str, list[Any]] = {"query": [], "passage": [], "label": []}
        for qid, docs in lists.items():
            for doc_id, score in zip(docs, scores[qid], strict=True):
                rows["query"].append(texts[qid])
                rows["passage"].append(run.texts[doc_id])
                rows["label"].append(score)
        return rows
    width = len(next(iter(lists.values()))) if lists else 0
    rows = {"query": [texts[qid] for qid in lists]}
    for column in range(width):
        rows[f"document_{column}"] = [run.texts[docs[column]] for docs in lists.values()]
    rows["label"] = [scores[qid] for qid in lists]
    return rows


def weighted(loss: Any, weight: float) -> Any:
    """A sentence-transformers loss times a weight, to mix two losses over two datasets."""
    from torch import nn

    class Weighted(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.loss, self.weight, self.model = loss, weight, loss.model

        def forward(self, inputs: Any, labels: Any, **kwargs: Any) -> Any:
            return self.weight * self.loss(inputs, labels, **kwargs)

    return Weighted()


def identity() -> Any:
    """The activation that leaves a cross-encoder's logits raw (its default is a sigmoid)."""
    from torch import nn

    return nn.Identity()


def lce_loss(encoder: Any) -> Any:
    """Localised contrastive estimation: sentence-transformers' multiple negatives ranking
    loss on the raw logits with each query's own hard negatives only; the in-batch ones
    (other queries' passages) are easy on a collection of many topics, and cost a forward
    pass each."""
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss

    class HardNegativesOnly(MultipleNegativesRankingLoss):
        def get_in_batch_negatives(self, anchors: Any, candidates: Any) -> Any:
            return iter(())

    return HardNegativesOnly(encoder, num_negatives=None, scale=1, activation_fn=identity())
