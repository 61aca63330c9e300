"""Loading a model by local folder or hub id, with errors that name the model and the setting
to change. Torch-free: the loaders are handed in."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ragrank.errors import ModelLoadError

if TYPE_CHECKING:
    from collections.abc import Callable

_Model = TypeVar("_Model")


def local_model_folder(model_id: str) -> Path | None:
    """The folder a model setting names, when it names one that exists (else a hub id)."""
    folder = Path(model_id).expanduser()
    return folder if folder.is_dir() else None


def error_summary(exc: BaseException) -> str:
    """`Type: first line of the message`, for errors that name a model and a setting."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def load_model(role: str, model_id: str, setting: str, loader: Callable[[str], _Model]) -> _Model:
    """Load a model by local path or hub id, turning every failure into a `ModelLoadError`."""
    local = Path(model_id).expanduser()
    if model_id.startswith((".", "/", "~")) and not local.exists():
        raise ModelLoadError(
            f"The {role} model folder {model_id!r} does not exist. "
            f"Set {setting} to a model folder or a Hugging Face model id."
        )
    source = str(local) if local.exists() else model_id
    try:
        return loader(source)
    except Exception as exc:
        raise ModelLoadError(
            f"Could not load the {role} model {model_id!r}: {error_summary(exc)} "
            f"If the Hugging Face Hub is unreachable and the model is not cached, download it "
            f"elsewhere and set {setting} to its local folder (or point HF_HOME at a cache "
            f"that holds it)."
        ) from exc
