"""A served model (its spec and the loaded model) and how a request's `model` picks one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from ragrank.errors import InvalidRequestError
from ragrank.settings import ANY_NAME, env_name

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ragrank.calibration import Calibration
    from ragrank.inference.spec import ModelSpec

Model = TypeVar("Model")


@dataclass(frozen=True)
class Served(Generic[Model]):
    """A loaded model with the spec it was loaded by."""

    spec: ModelSpec
    model: Model
    #: A reranker's calibration, read from its folder (None: the plain sigmoid).
    calibration: Calibration | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return self.spec.names

    @property
    def name(self) -> str:
        """Its first name: what `/v1/models`, `/ready` and the metrics call it."""
        return self.spec.name


def pick(served: Sequence[Served[Model]], name: str | None, *, strict: bool) -> Served[Model]:
    """The served model a request names. Absent, or a name no model answers to: the one named
    `*` if any, else the default (the first), so that clients sending a vendor's name work
    unchanged. `strict` makes an unknown name a 400 listing the served ones instead."""
    if name is None:
        return served[0]
    for candidate in served:
        if name in candidate.names:
            return candidate
    for candidate in served:
        if ANY_NAME in candidate.names:
            return candidate
    if not strict:
        return served[0]
    listed = "; ".join(" | ".join(s.names) for s in served)
    raise InvalidRequestError(
        f"model: {name!r} is not served here; the {served[0].spec.role.name} models are: "
        f"{listed} (see /v1/models, or set {env_name('model_names')}=open to answer any name "
        f"with the default)",
        field="model",
    )
