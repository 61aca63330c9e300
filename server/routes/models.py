"""The served models: `GET /v1/models`, OpenAI-shaped, which clients read to list what a
request's `model` may name."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from litestar import get
from msgspec import Meta, Struct

from ragrank.inference import Inference, Served
from ragrank.protocols import ModelRole
from server.routes.shared import domain, error_responses

#: When this process started serving: OpenAI's `created`, the same for every model.
_STARTED = int(time.time())


class ModelCard(Struct, frozen=True, kw_only=True):
    """One served model, as OpenAI lists a model, with what ragrank adds."""

    id: Annotated[str, Meta(description="The name requests pick it by (its first name).")]
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ragrank"
    type: Annotated[ModelRole, Meta(description="Its role.")]
    model: Annotated[str, Meta(description="The hub id or folder it was loaded from.")]
    names: Annotated[
        list[str], Meta(description="Every name that picks it; `*` takes any name not served.")
    ]
    default: Annotated[bool, Meta(description="Whether a request that names no model gets it.")]
    backend: Annotated[
        str, Meta(description="What runs it: `torch`, or an OpenVINO recipe on the CPU.")
    ]
    dtype: Annotated[str, Meta(description="The floating-point type of its forward passes.")]
    device: Annotated[str, Meta(description="Where it runs: `cpu`, `cuda`, `cuda:N`.")]


class ModelList(Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


@get("/v1/models")
async def models(inference: Inference) -> ModelList:
    """Every served model: the embedders, then the rerankers, each role's default first."""

    def card(served: Served[Any], position: int) -> ModelCard:
        placement = inference.placement(served)
        role: ModelRole = served.spec.role.name
        return ModelCard(
            id=served.name,
            created=_STARTED,
            type=role,
            model=served.model.model_id,
            names=list(served.names),
            default=position == 0,
            backend=placement.backend,
            dtype=placement.dtype,
            device=placement.device,
        )

    return ModelList(
        data=[
            *(card(s, i) for i, s in enumerate(inference.embedders)),
            *(card(s, i) for i, s in enumerate(inference.rerankers)),
        ]
    )


router = domain(models, tags=["operations"], responses=error_responses(401, 500))
