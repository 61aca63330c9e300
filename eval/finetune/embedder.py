"""`ragrank finetune embedder`: train the bi-encoder with the multiple-negatives ranking loss
(in-batch negatives) plus the mined hard negatives, keeping the query and passage prefixes.
The saved folder is what `RAGRANK_EMBED_MODEL` points at, and it records its prefixes."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from eval.finetune.data import MODEL_FOLDER, TrainingData, positives
from eval.finetune.trainer import (
    ValidationNdcg,
    baseline_metrics,
    open_run,
    train_and_report,
    training_arguments,
)
from ragrank.errors import ModelLoadError
from ragrank.loading import load_model
from ragrank.roles import EMBEDDING
from ragrank.settings import Settings, env_name

if TYPE_CHECKING:
    from pathlib import Path

    from eval.metrics import Run
    from eval.options import FinetuneOptions


def finetune_embedder(settings: Settings, options: FinetuneOptions) -> Path:
    """Run (or resume) one fine-tuning run; returns the saved model folder."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import (
        BatchSamplers,
        SentenceTransformerTrainingArguments,
    )

    if options.loss != "mnrl":
        raise ModelLoadError(f"--loss {options.loss!r}: an embedder trains with mnrl")
    options = replace(options, base=options.base or settings.embed_model)
    # The base model mines its own hard negatives, with the configured prefixes.
    query_prefix, passage_prefix = settings.prefixes()
    settings = replace(
        settings,
        embed_model=str(options.base),
        query_prefix=query_prefix,
        passage_prefix=passage_prefix,
    )
    run = open_run(EMBEDDING.trainee, options, settings)
    if run is None:
        return options.output / MODEL_FOLDER
    dataset, data = run.dataset, run.data
    model = _load_base(str(options.base), options.max_length, run.device)
    # Recorded in the saved folder, so ragrank applies the same prefixes whatever it is called.
    model.prompts = {"query": query_prefix, "passage": passage_prefix}
    validation = ValidationNdcg(
        lambda trained: _retrieve(
            trained, dataset, texts=run.texts, data=data, options=options, settings=settings
        ),
        {qid: dataset.qrels[qid] for qid in data.split.validation},
    )
    baseline = baseline_metrics(options, validation, model)
    rows = _rows(dataset.queries, dataset.qrels, run.texts, data, options)
    prompts = {
        column: prefix
        for column in rows
        if (prefix := query_prefix if column == "anchor" else passage_prefix)
    }
    arguments = training_arguments(
        options,
        run.device,
        len(rows["anchor"]),
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        **({"prompts": prompts} if prompts else {}),
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=SentenceTransformerTrainingArguments(**arguments),
        train_dataset=Dataset.from_dict(rows),
        loss=MultipleNegativesRankingLoss(model),
        evaluator=validation,
    )
    return train_and_report(
        EMBEDDING.trainee,
        run,
        options,
        trainer=trainer,
        baseline=baseline,
        examples=len(rows["anchor"]),
        details={
            "loss_function": "multiple negatives ranking (in-batch + mined hard negatives)",
            "query_prefix": query_prefix,
            "passage_prefix": passage_prefix,
            "validation_pool": "validation positives + each validation query's "
            f"{options.validation_candidates} cosine candidates of the base model",
        },
    )


def _load_base(base: str, max_length: int, device: str) -> Any:
    from sentence_transformers import SentenceTransformer

    def loader(source: str) -> Any:
        model = SentenceTransformer(source, device=device)
        limit = model.max_seq_length or max_length
        model.max_seq_length = min(int(limit), max_length)
        return model

    setting = env_name(EMBEDDING.setting("model"))
    return load_model(EMBEDDING.label, base, f"--base (default {setting})", loader)


def _rows(
    queries: Any, qrels: Any, texts: dict[str, str], data: TrainingData, options: FinetuneOptions
) -> dict[str, list[str]]:
    """One (anchor, positive, negative_1..n) row per labelled (train query, positive) pair;
    a query with fewer than n mined negatives reuses them in turn. Queries left with none
    are skipped: the in-batch negatives alone would still train them, but every row of a
    batch must have the same columns."""
    columns = ["anchor", "positive", *(f"negative_{i + 1}" for i in range(options.negatives))]
    rows: dict[str, list[str]] = {column: [] for column in columns}
    for qid in data.split.train:
        negatives = data.negatives[qid]
        if not negatives:
            continue
        for turn, doc_id in enumerate(sorted(positives(qrels, qid))):
            rows["anchor"].append(queries[qid])
            rows["positive"].append(texts[doc_id])
            for i in range(options.negatives):
                pick = negatives[(turn * options.negatives + i) % len(negatives)]
                rows[f"negative_{i + 1}"].append(texts[pick])
    return rows


def _retrieve(
    model: Any,
    dataset: Any,
    *,
    texts: dict[str, str],
    data: TrainingData,
    options: FinetuneOptions,
    settings: Settings,
) -> Run:
    """Validation run: each validation query's cosine ranking of the validation pool (every
    validation positive and candidate), embedded by the model being trained. Embedding the
    whole corpus each epoch would cost more than the training on a CPU."""
    pool = sorted(
        {doc_id for docs in data.validation_candidates.values() for doc_id in docs}
        | {doc_id for qid in data.validation_candidates for doc_id in positives(dataset.qrels, qid)}
    )
    query_ids = list(data.validation_candidates)

    def encode(items: list[str]) -> np.ndarray:
        vectors = model.encode(
            items,
            batch_size=options.batch_size * 2,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    query_prefix, passage_prefix = settings.prefixes()
    documents = encode([passage_prefix + texts[doc_id] for doc_id in pool])
    question = encode([query_prefix + dataset.queries[qid] for qid in query_ids])
    similarity = question @ documents.T
    depth = min(100, len(pool))
    run: dict[str, dict[str, float]] = {}
    for row, qid in enumerate(query_ids):
        top = np.argsort(-similarity[row])[:depth]
        run[qid] = {pool[i]: float(similarity[row, i]) for i in top}
    return run
