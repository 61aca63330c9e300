"""Preparing models ahead of time (`ragrank models pull` / `check`), so that a stack can be
made ready before it goes offline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.errors import ModelLoadError
from ragrank.loading import error_summary, local_model_folder
from ragrank.settings import Settings, env_name

#: (role, settings field) of every model the configuration names.
ROLES = (("embedding", "embed_model"), ("reranking", "rerank_model"))


def configured(settings: Settings) -> list[tuple[str, str, str]]:
    """(role, settings field, model id) of every served model, the defaults first."""
    served = {"embed_model": settings.served_embedders, "rerank_model": settings.served_rerankers}
    listed = {"embed_model": "embed_models", "rerank_model": "rerank_models"}
    models = []
    for role, field in ROLES:
        for position, model in enumerate(served[field]):
            models.append((role, field if position == 0 else listed[field], model.model_id))
    return models


@dataclass(frozen=True)
class ModelStatus:
    """What `check` found for one configured model."""

    role: str
    model_id: str
    setting: str
    source: str
    loads: bool
    dimension: int | None = None
    max_length: int | None = None
    #: `torch`, or the CPU backend's recipe and how its model was made (converted, or read
    #: from the cache).
    backend: str = "torch"
    error: str = ""


def pull(settings: Settings) -> list[tuple[str, str, str]]:
    """Download every configured hub model into the Hugging Face cache; (role, model, where)."""
    from huggingface_hub import snapshot_download

    pulled = []
    for role, field, model_id in configured(settings):
        if (local := local_model_folder(model_id)) is not None:
            pulled.append((role, model_id, f"local folder {local.resolve()}, nothing to pull"))
            continue
        try:
            path = snapshot_download(model_id)
        except Exception as exc:
            raise ModelLoadError(
                f"Could not download the {role} model {model_id!r}: {error_summary(exc)} "
                f"Check the model id and the network, or set {env_name(field)} to a local "
                f"folder."
            ) from exc
        pulled.append((role, model_id, path))
    return pulled


def source(model_id: str) -> str:
    """Where a model would load from: its local folder, the Hugging Face cache, or the hub."""
    if (local := local_model_folder(model_id)) is not None:
        return f"local folder {local.resolve()}"
    from huggingface_hub import snapshot_download

    try:
        return f"cache {snapshot_download(model_id, local_files_only=True)}"
    except Exception:
        return "the hub (not cached here)"


def check(settings: Settings) -> list[ModelStatus]:
    """Load every configured model through the code the server uses and report on it."""
    statuses = []
    for role, field, model_id in configured(settings):
        common: dict[str, Any] = {
            "role": role,
            "model_id": model_id,
            "setting": env_name(field),
            "source": source(model_id),
        }
        try:
            model: SentenceTransformerEmbedder | CrossEncoderScorer
            if role == "embedding":
                model = SentenceTransformerEmbedder.from_settings(settings, model_id)
                dimension: int | None = model.dimension
            else:
                model = CrossEncoderScorer.from_settings(settings, model_id)
                dimension = None
        except ModelLoadError as exc:
            statuses.append(ModelStatus(**common, loads=False, error=str(exc)))
            continue
        backend = model.backend
        if model.conversion is not None:
            backend += f" ({model.conversion})"
        statuses.append(
            ModelStatus(
                **common,
                loads=True,
                dimension=dimension,
                max_length=model.max_length,
                backend=backend,
            )
        )
    return statuses
