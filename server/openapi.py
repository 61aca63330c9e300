"""The served OpenAPI document, completed from the request types the app registers: all that
the decoder enforces on their bodies, and what the fields declare (`exactly_one_of`, a flag
with one served value, a vector length the model fixes). It walks the app's own handlers, so a
struct is completed wherever it is defined."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from litestar.openapi.spec import OpenAPI, OpenAPIType, Schema

from ragrank.settings import ANY_NAME

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from litestar import Litestar

    from ragrank.protocols import ModelRole


def request_types(app: Litestar) -> list[type]:
    """The body type of every route that reads one, in registration order."""
    found: dict[type, None] = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            data = handler.parsed_fn_signature.parameters.get("data")
            if data is not None and isinstance(data.annotation, type):
                found[data.annotation] = None
    return list(found)


def _structs(kinds: Iterable[type]) -> Iterator[msgspec.inspect.StructType]:
    """Each struct reachable from `kinds` (their fields' types, through unions, lists and
    dicts), once."""
    seen: set[type] = set()
    pending: list[Any] = [msgspec.inspect.type_info(kind) for kind in kinds]
    while pending:
        node = pending.pop(0)
        if isinstance(node, msgspec.inspect.StructType):
            if node.cls in seen:
                continue
            seen.add(node.cls)
            yield node
            pending.extend(field.type for field in node.fields)
        elif isinstance(node, msgspec.inspect.Metadata):
            pending.append(node.type)
        elif isinstance(node, msgspec.inspect.UnionType):
            pending.extend(node.types)
        elif isinstance(node, msgspec.inspect.ListType):
            pending.append(node.item_type)
        elif isinstance(node, msgspec.inspect.DictType):
            pending.extend((node.key_type, node.value_type))


def _extra(node: Any) -> dict[str, Any]:
    """What a field's `Meta(extra=...)` declares, through an optional's union."""
    if isinstance(node, msgspec.inspect.Metadata):
        return dict(node.extra or {})
    if isinstance(node, msgspec.inspect.UnionType):
        merged: dict[str, Any] = {}
        for alternative in node.types:
            merged |= _extra(alternative)
        return merged
    return {}


def complete_request_schemas(openapi: OpenAPI, kinds: Iterable[type]) -> None:
    """Say in the OpenAPI schema all that the decoder enforces on request bodies, so clients and
    fuzzers see the real contract. Litestar's schema generation drops what msgspec's own JSON
    schema keeps: no unknown fields (a typo such as `topk` is a 400, not ignored), and the
    limits on objects' keys (`propertyNames`, `maxProperties`), e.g. of `filter`. And a union
    such as `str | int | float` is `anyOf`, not `oneOf`: 5 is both an integer and a number."""
    schemas = openapi.components.schemas if openapi.components else None
    for struct in _structs(kinds):
        name = struct.cls.__name__
        component = (schemas or {}).get(name)
        if not struct.forbid_unknown_fields or not isinstance(component, Schema):
            continue
        exact = msgspec.json.schema(struct.cls)["$defs"][name]
        _any_of_for_unions(component)
        component.additional_properties = False
        exactly_one: tuple[str, ...] = getattr(struct.cls, "exactly_one_of", ())
        if exactly_one:
            component.one_of = [Schema(required=[field]) for field in exactly_one]
        properties = component.properties or {}
        for field in struct.fields:
            target = properties.get(field.encode_name)
            if not isinstance(target, Schema):
                continue
            if "only" in (extra := _extra(field.type)):
                target.enum = [extra["only"]]
            _copy_limits(exact["properties"][field.encode_name], target)


def write_dimension_into_schema(openapi: OpenAPI, kinds: Iterable[type], dimension: int) -> None:
    """Once the embedder is loaded: the vector length its `dimensions` fields must give."""
    for option, _ in _marked_options(openapi, kinds, "model_dimension", OpenAPIType.INTEGER):
        option.minimum = option.maximum = dimension


def write_models_into_schema(
    openapi: OpenAPI, kinds: Iterable[type], names: Mapping[ModelRole, Sequence[str]]
) -> None:
    """Once the models are loaded, under strict model names: the names each `model` field
    accepts (by role), unless a model of that role takes any name (`*`)."""
    for option, role in _marked_options(openapi, kinds, "served_models", OpenAPIType.STRING):
        if role in names and ANY_NAME not in names[role]:
            option.enum = sorted(set(names[role]))


def _marked_options(
    openapi: OpenAPI, kinds: Iterable[type], mark: str, kind: OpenAPIType
) -> Iterator[tuple[Schema, Any]]:
    """The schemas of type `kind` (the field's own, or a branch of its union) of every request
    field whose type carries `mark` in its extra metadata, with the mark's value."""
    schemas = openapi.components.schemas if openapi.components else None
    for struct in _structs(kinds):
        component = (schemas or {}).get(struct.cls.__name__)
        if not isinstance(component, Schema):
            continue
        for field in struct.fields:
            target = (component.properties or {}).get(field.encode_name)
            value = _extra(field.type).get(mark)
            if not isinstance(target, Schema) or not value:
                continue
            for option in [target, *(target.any_of or [])]:
                if isinstance(option, Schema) and option.type == kind:
                    yield option, value


def _any_of_for_unions(schema: Schema) -> None:
    if schema.one_of:
        schema.any_of, schema.one_of = schema.one_of, None
    children = [
        *(schema.any_of or []),
        *(schema.properties or {}).values(),
        schema.items,
        schema.additional_properties,
    ]
    for child in children:
        if isinstance(child, Schema):
            _any_of_for_unions(child)


#: msgspec's JSON-schema limits and the Litestar `Schema` attributes that hold them.
_LIMITS = {
    "minLength": "min_length",
    "maxLength": "max_length",
    "pattern": "pattern",
    "minItems": "min_items",
    "maxItems": "max_items",
    "minimum": "minimum",
    "maximum": "maximum",
    "maxProperties": "max_properties",
}


def _copy_limits(rules: dict[str, Any], target: Schema) -> None:
    """Copy msgspec's limits into Litestar's schema of the same value, alternatives of a union
    matched by their JSON type."""
    for alternative in rules.get("anyOf", []):
        for candidate in target.any_of or []:
            if isinstance(candidate, Schema) and _same_type(alternative, candidate):
                _copy_limits(alternative, candidate)
    if "type" not in rules or not _same_type(rules, target):
        return
    for key, attribute in _LIMITS.items():
        if key in rules:
            setattr(target, attribute, rules[key])
    keys = rules.get("propertyNames")
    if keys:
        target.property_names = Schema(
            min_length=keys.get("minLength"),
            max_length=keys.get("maxLength"),
            pattern=keys.get("pattern"),
        )
    if isinstance(rules.get("items"), dict) and isinstance(target.items, Schema):
        _copy_limits(rules["items"], target.items)


def _same_type(rules: dict[str, Any], target: Schema) -> bool:
    kind = target.type.value if isinstance(target.type, OpenAPIType) else None
    return rules.get("type") == kind
