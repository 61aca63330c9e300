"""The configured request limits (`RAGRANK_MAX_*`): checked on every decoded body before any
model work, and written into the OpenAPI schema the server serves, so both say the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from litestar.openapi.spec import OpenAPI, Schema

from ragrank.errors import InvalidRequestError
from ragrank.settings import Settings, env_name
from server.schemas import (
    DocumentsRequest,
    EmbeddingsRequest,
    RerankDocument,
    RerankRequest,
    SearchRequest,
    TeiRerankRequest,
)

if TYPE_CHECKING:
    from collections.abc import Iterator


@dataclass(frozen=True)
class Limit:
    """`setting` bounds the `kind` of `field` (dotted; `[]` for every item of a list)."""

    field: str
    kind: Literal["chars", "items", "value"]
    setting: str


LIMITS: dict[type, tuple[Limit, ...]] = {
    SearchRequest: (
        Limit("query", "chars", "max_query_chars"),
        Limit("top_k", "value", "max_top_k"),
        Limit("candidates", "value", "max_candidates"),
    ),
    RerankRequest: (
        Limit("query", "chars", "max_query_chars"),
        Limit("documents", "items", "max_rerank_documents"),
        Limit("documents[]", "chars", "max_document_chars"),
    ),
    TeiRerankRequest: (
        Limit("query", "chars", "max_query_chars"),
        Limit("texts", "items", "max_rerank_documents"),
        Limit("texts[]", "chars", "max_document_chars"),
    ),
    EmbeddingsRequest: (
        Limit("input", "chars", "max_document_chars"),
        Limit("input", "items", "max_embed_inputs"),
        Limit("input[]", "chars", "max_document_chars"),
    ),
    DocumentsRequest: (
        Limit("documents", "items", "max_ingest_documents"),
        Limit("documents[].text", "chars", "max_ingest_document_chars"),
    ),
}

_UNITS = {"chars": "characters", "items": "items", "value": ""}


def check_limits(body: Any, settings: Settings) -> None:
    """A 400 naming the field, the limit and its variable for the first limit `body` breaks."""
    for limit in LIMITS.get(type(body), ()):
        bound: int = getattr(settings, limit.setting)
        for path, value in _values(body, limit.field):
            size = _size(value, limit.kind)
            if size is not None and size > bound:
                unit = f" {_UNITS[limit.kind]}" if _UNITS[limit.kind] else ""
                raise InvalidRequestError(
                    f"{path}: at most {bound:,}{unit}, got {size:,} ({env_name(limit.setting)})",
                    field=path,
                )


def _values(body: Any, field: str) -> Iterator[tuple[str, Any]]:
    name, _, rest = field.partition(".")
    items = name.endswith("[]")
    value = getattr(body, name.removesuffix("[]"))
    if items:
        if not isinstance(value, list):
            return
        for index, item in enumerate(value):
            path = f"{name[:-2]}[{index}]"
            if rest:
                yield from ((f"{path}.{p}", v) for p, v in _values(item, rest))
            else:
                yield path, item.text if isinstance(item, RerankDocument) else item
    else:
        yield name, value


def _size(value: Any, kind: str) -> int | None:
    if kind == "value":
        return int(value)
    if kind == "items":
        return len(value) if isinstance(value, list) else None
    return len(value) if isinstance(value, str) else None


def write_limits_into_schema(openapi: OpenAPI, settings: Settings) -> None:
    """Put the configured limits where the schema holds the types' ceilings."""
    schemas = openapi.components.schemas if openapi.components else None
    if not schemas:
        return
    for kind, limits in LIMITS.items():
        for limit in limits:
            component = schemas.get(kind.__name__)
            if isinstance(component, Schema):
                bound = getattr(settings, limit.setting)
                for target in _schemas_at(component, limit.field, schemas):
                    _set_bound(target, limit.kind, bound)


def _schemas_at(schema: Schema, field: str, schemas: dict[str, Any]) -> Iterator[Schema]:
    """The schemas of `field` within `schema`, through unions, lists and references."""
    name, _, rest = field.partition(".")
    target = (schema.properties or {}).get(name.removesuffix("[]"))
    for found in _alternatives(target, schemas):
        if name.endswith("[]"):
            for item in _alternatives(found.items, schemas):
                yield from _schemas_at(item, rest, schemas) if rest else (item,)
        else:
            yield from _schemas_at(found, rest, schemas) if rest else (found,)


def _alternatives(schema: Any, schemas: dict[str, Any]) -> Iterator[Schema]:
    if hasattr(schema, "ref") and isinstance(schema.ref, str):
        schema = schemas.get(schema.ref.rsplit("/", 1)[-1])
    if not isinstance(schema, Schema):
        return
    yield schema
    for alternative in schema.any_of or []:
        yield from _alternatives(alternative, schemas)


def _set_bound(schema: Schema, kind: str, bound: int) -> None:
    type_name = getattr(schema.type, "value", None)
    if kind == "chars" and type_name == "string":
        schema.max_length = bound
    elif kind == "items" and type_name == "array":
        schema.max_items = bound
    elif kind == "value" and type_name == "integer":
        schema.maximum = bound
    elif type_name == "object" and kind == "chars":
        # A document given as {"text": ...}: its text property.
        text = (schema.properties or {}).get("text")
        if isinstance(text, Schema):
            text.max_length = bound
