"""Preparing models ahead of time (`ragrank models pull` / `check`), so that a stack can be
made ready before it goes offline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragrank.backends.serving import load_model
from ragrank.errors import ModelLoadError
from ragrank.inference import ModelSpec, model_specs
from ragrank.loading import error_summary, local_model_folder
from ragrank.roles import EMBEDDING
from ragrank.settings import Settings, env_name


def configured(settings: Settings) -> list[tuple[ModelSpec, str]]:
    """Every served model's spec, the defaults first, and the setting that names it: its
    role's model variable, its model list, or the models file."""
    specs = model_specs(settings)
    models = []
    for spec in specs.all:
        role = spec.role
        if settings.models_file is not None and spec in _from_file(settings):
            setting = env_name("models_file")
        elif spec is specs.of(role)[0]:
            setting = env_name(role.setting("model"))
        else:
            setting = env_name(role.setting("models"))
        models.append((spec, setting))
    return models


def _from_file(settings: Settings) -> tuple[ModelSpec, ...]:
    from ragrank.inference import read_models_file

    assert settings.models_file is not None
    return read_models_file(settings.models_file, settings)


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
    for spec, setting in configured(settings):
        role, model_id = spec.role.label, spec.model
        if (local := local_model_folder(model_id)) is not None:
            pulled.append((role, model_id, f"local folder {local.resolve()}, nothing to pull"))
            continue
        try:
            path = snapshot_download(model_id)
        except Exception as exc:
            raise ModelLoadError(
                f"Could not download the {role} model {model_id!r}: {error_summary(exc)} "
                f"Check the model id and the network, or set {setting} to a local folder."
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
    for spec, setting in configured(settings):
        common: dict[str, Any] = {
            "role": spec.role.label,
            "model_id": spec.model,
            "setting": setting,
            "source": source(spec.model),
        }
        try:
            model = load_model(spec, settings)
            dimension: int | None = model.dimension if spec.role is EMBEDDING else None
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
