"""Embeddings: OpenAI's (also Infinity's and Jina's) `POST /v1/embeddings`, text-embeddings-
inference's `POST /embed` and `POST /`, Cohere's `POST /v1/embed` and `/v2/embed`."""

from __future__ import annotations

import base64
import uuid
from typing import Annotated, Any, Literal

from litestar import Request, post
from litestar.status_codes import HTTP_200_OK
from msgspec import Meta, Struct

from ragrank.errors import InvalidRequestError
from ragrank.inference import Inference
from server.limits import length_limit
from server.routes.shared import (
    MODEL_ERRORS,
    ApiVersion,
    CoherePriority,
    EmbedderName,
    TruncationDirection,
    domain,
    unless_disconnected,
)

EmbedText = Annotated[str, length_limit("max_document_chars", min_length=1)]


EmbedTexts = Annotated[list[EmbedText], length_limit("max_embed_inputs", min_length=1)]
Dimensions = (
    Annotated[
        int,
        Meta(
            ge=1,
            description="The vectors' length: only the model's own is served (ragrank "
            "does not shorten vectors).",
            # The served schema gives the embedder's length once the model is loaded.
            extra={"model_dimension": True},
        ),
    ]
    | None
)
#: How vectors travel: JSON numbers, or little-endian float32 bytes in base64.
EncodingFormat = Literal["float", "base64"]
JinaTask = Literal[
    "retrieval.query",
    "retrieval.passage",
    "text-matching",
    "classification",
    "separation",
    "code.query",
    "code.passage",
]

#: Jina's tasks, by the e5 prefix each gets: e5 reads symmetric tasks as queries.
JINA_TASKS: dict[JinaTask, Literal["query", "passage"]] = {
    "retrieval.query": "query",
    "retrieval.passage": "passage",
    "text-matching": "query",
    "classification": "query",
    "separation": "query",
    "code.query": "query",
    "code.passage": "passage",
}


class EmbeddingsRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's embeddings request, which is also Infinity's and Jina's; `input_type` (or
    Jina's `task`) picks the e5 prefix."""

    input: EmbedText | EmbedTexts
    model: EmbedderName = None
    encoding_format: EncodingFormat = "float"
    input_type: Annotated[
        Literal["query", "passage"],
        Meta(description="Which prefix the texts get (`query: ` or `passage: ` for e5)."),
    ] = "passage"
    task: Annotated[
        JinaTask | None,
        Meta(
            description="Jina's task, read as `input_type`: `retrieval.passage` and "
            "`code.passage` are passages, the others queries."
        ),
    ] = None
    dimensions: Dimensions = None
    normalized: Annotated[
        bool,
        Meta(
            description="Jina: vectors are always unit length; `false` is refused.",
            extra={"only": True},
        ),
    ] = True
    embedding_type: Annotated[
        EncodingFormat | None, Meta(description="Jina's `encoding_format`.")
    ] = None
    late_chunking: Annotated[
        bool, Meta(description="Jina: not served; only `false` is accepted.", extra={"only": False})
    ] = False
    user: str | None = None


class Embedding(Struct, frozen=True, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Annotated[
        list[float] | str,
        Meta(description="Floats, or base64 of little-endian float32 when asked for."),
    ]


class EmbeddingsUsage(Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class TeiEmbedRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """text-embeddings-inference's embed request (also what Hugging Face's client sends to a
    TEI URL). Its clients do not say which texts are queries: `prompt_name` does."""

    inputs: EmbedText | EmbedTexts
    normalize: Annotated[bool, Meta(description="Accepted; vectors are always unit length.")] = True
    truncate: bool | None = None
    truncation_direction: TruncationDirection = None
    prompt_name: Annotated[
        Literal["query", "passage", "document"] | None,
        Meta(description="`query` gives the query prefix; absent or the others, the passage one."),
    ] = None
    dimensions: Dimensions = None
    model: EmbedderName = None


class CohereEmbedRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Cohere's embed request, v1 and v2: texts only (no images)."""

    texts: EmbedTexts
    model: EmbedderName = None
    input_type: Annotated[
        Literal["search_query", "search_document", "classification", "clustering"] | None,
        Meta(
            description="`search_document` (and absent) embeds passages; the others queries, "
            "as e5 reads symmetric tasks."
        ),
    ] = None
    embedding_types: (
        Annotated[
            list[Literal["float"]],
            Meta(min_length=1, max_length=1, description="Only `float` vectors are served."),
        ]
        | None
    ) = None
    truncate: Annotated[
        Literal["NONE", "START", "END"] | None,
        Meta(description="Accepted; a text past the model's window is cut at its end."),
    ] = None
    output_dimension: Dimensions = None
    max_tokens: Annotated[
        int | None, Meta(description="Accepted and ignored: the model's window applies.")
    ] = None
    priority: CoherePriority = None


class CohereBilledUnits(Struct, frozen=True, kw_only=True):
    input_tokens: int


class CohereEmbedMeta(Struct, frozen=True, kw_only=True):
    api_version: ApiVersion
    billed_units: CohereBilledUnits


class CohereFloats(Struct, frozen=True, kw_only=True, rename={"float_": "float"}):
    float_: list[list[float]]


class CohereEmbedResponse(Struct, frozen=True, kw_only=True):
    """Cohere's embed answer: `embeddings` by type (v2, or v1 asked for types), else the
    floats themselves (v1)."""

    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    id: str
    embeddings: list[list[float]] | CohereFloats
    texts: list[str]
    meta: CohereEmbedMeta


def _dimensions(inference: Inference, field: str, asked: int | None, model: str | None) -> None:
    """A 400 unless `asked` is absent or the named embedder's own vector length."""
    served = inference.embedding(model).model.dimension
    if asked is not None and asked != served:
        raise InvalidRequestError(
            f"{field}: this server's embedder gives {served}-dimensional vectors, and ragrank "
            f"does not shorten them; give {served} or leave {field} out",
            field=field,
        )


@post(["/v1/embeddings", "/embeddings"], status_code=HTTP_200_OK)
async def embeddings(
    data: EmbeddingsRequest, inference: Inference, request: Request[Any, Any, Any]
) -> EmbeddingsResponse:
    """OpenAI-shaped embeddings, which Infinity's (`/embeddings`) and Jina's clients call too;
    `input_type` or Jina's `task` picks the query or passage prefix."""
    _dimensions(inference, "dimensions", data.dimensions, data.model)
    if not data.normalized:
        raise InvalidRequestError(
            "normalized: ragrank's vectors are always unit length; leave normalized out or "
            "give true",
            field="normalized",
        )
    if data.late_chunking:
        raise InvalidRequestError(
            "late_chunking: not served; each input is embedded on its own", field="late_chunking"
        )
    role = JINA_TASKS[data.task] if data.task is not None else data.input_type
    encoding = data.embedding_type or data.encoding_format
    texts = [data.input] if isinstance(data.input, str) else data.input
    outcome = await unless_disconnected(
        request, inference.embed(texts, as_queries=role == "query", model=data.model)
    )
    return EmbeddingsResponse(
        data=[
            Embedding(
                index=index,
                embedding=(
                    base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                    if encoding == "base64"
                    else vector.tolist()
                ),
            )
            for index, vector in enumerate(outcome.vectors)
        ],
        model=outcome.model,
        usage=EmbeddingsUsage(prompt_tokens=outcome.tokens, total_tokens=outcome.tokens),
    )


@post("/embed", status_code=HTTP_200_OK)
async def embed_tei(
    data: TeiEmbedRequest, inference: Inference, request: Request[Any, Any, Any]
) -> list[list[float]]:
    """text-embeddings-inference-shaped embeddings, at `/embed` and at `/` (`embed_tei_at_root`),
    where Hugging Face's client posts when pointed at a TEI URL; `prompt_name: query` gives the
    query prefix."""
    _dimensions(inference, "dimensions", data.dimensions, data.model)
    texts = [data.inputs] if isinstance(data.inputs, str) else data.inputs
    as_queries = data.prompt_name == "query"
    outcome = await unless_disconnected(
        request, inference.embed(texts, as_queries=as_queries, model=data.model)
    )
    return [vector.tolist() for vector in outcome.vectors]


@post(["/v1/embed", "/v2/embed"], status_code=HTTP_200_OK)
async def embed_cohere(
    data: CohereEmbedRequest, inference: Inference, request: Request[Any, Any, Any]
) -> CohereEmbedResponse:
    """Cohere-shaped embeddings, v1 and v2: `search_document` (or no `input_type`) embeds
    passages, the other input types queries."""
    _dimensions(inference, "output_dimension", data.output_dimension, data.model)
    as_queries = data.input_type not in (None, "search_document")
    outcome = await unless_disconnected(
        request, inference.embed(data.texts, as_queries=as_queries, model=data.model)
    )
    vectors = [vector.tolist() for vector in outcome.vectors]
    version = "2" if request.url.path.startswith("/v2/") else "1"
    by_type = version == "2" or data.embedding_types is not None
    return CohereEmbedResponse(
        response_type="embeddings_by_type" if by_type else "embeddings_floats",
        id=str(uuid.uuid4()),
        embeddings=CohereFloats(float_=vectors) if by_type else vectors,
        texts=data.texts,
        meta=CohereEmbedMeta(
            api_version=ApiVersion(version=version),
            billed_units=CohereBilledUnits(input_tokens=outcome.tokens),
        ),
    )


router = domain(embeddings, embed_tei, embed_cohere, tags=["embeddings"], responses=MODEL_ERRORS)

#: TEI's embed again at `/`, where Hugging Face's client posts when pointed at a TEI URL, with
#: this domain's tags and answers; `server.routes.root` serves it beside the landing page.
embed_tei_at_root = post(
    "/", status_code=HTTP_200_OK, tags=router.tags, responses=embed_tei.responses
)(embed_tei.fn)
