"""The served OpenAPI document, completed from the request types the app registers: all that
the decoder enforces on their bodies, what the fields declare (`exactly_one_of`, a flag with
one served value, a vector length the model fixes), and the configured request limits, which
the body guard (`server/limits.py`) enforces. It walks the app's own handlers, so a struct is
completed wherever it is defined."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from litestar.openapi.spec import OpenAPI, OpenAPIType, Schema

from ragrank.settings import ANY_NAME, env_name
from server.fields import declared, structs
from server.limits import limits_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from litestar import Litestar

    from ragrank.protocols import ModelRole
    from ragrank.settings import Settings


def request_types(app: Litestar) -> list[type]:
    """The body type of every route that reads one, in registration order."""
    found: dict[type, None] = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            data = handler.parsed_fn_signature.parameters.get("data")
            if data is not None and isinstance(data.annotation, type):
                found[data.annotation] = None
    return list(found)


def complete_request_schemas(openapi: OpenAPI, kinds: Iterable[type]) -> None:
    """Say in the OpenAPI schema all that the decoder enforces on request bodies, so clients and
    fuzzers see the real contract. Litestar's schema generation drops what msgspec's own JSON
    schema keeps: no unknown fields (a typo such as `topk` is a 400, not ignored), and the
    limits on objects' keys (`propertyNames`, `maxProperties`), e.g. of `filter`. And a union
    such as `str | int | float` is `anyOf`, not `oneOf`: 5 is both an integer and a number."""
    schemas = openapi.components.schemas if openapi.components else None
    for struct in structs(kinds):
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
            if "only" in (extra := declared(field.type)):
                target.enum = [extra["only"]]
            _copy_limits(exact["properties"][field.encode_name], target)


def write_dimension_into_schema(openapi: OpenAPI, kinds: Iterable[type], dimension: int) -> None:
    """Once the embedder is loaded: the vector length its `dimensions` fields must give."""
    for option, _ in _marked_options(openapi, kinds, "model_dimension", OpenAPIType.INTEGER):
        option.minimum = option.maximum = dimension


def write_models_into_schema(
    openapi: OpenAPI,
    kinds: Iterable[type],
    names: Mapping[ModelRole, Sequence[str]],
    *,
    strict: bool,
) -> None:
    """Once the models are loaded: the names a field that must name a served model accepts
    (`served_only`, e.g. a cascade's model), and under strict model names the names each
    `model` field accepts (`served_models`), unless a model of that role takes any name."""
    for option, role in _marked_options(openapi, kinds, "served_only", OpenAPIType.STRING):
        if role in names:
            option.enum = sorted(set(names[role]))
    if not strict:
        return
    for option, role in _marked_options(openapi, kinds, "served_models", OpenAPIType.STRING):
        if role in names and ANY_NAME not in names[role]:
            option.enum = sorted(set(names[role]))


def _marked_options(
    openapi: OpenAPI, kinds: Iterable[type], mark: str, kind: OpenAPIType
) -> Iterator[tuple[Schema, Any]]:
    """The schemas of type `kind` (the field's own, or a branch of its union) of every request
    field whose type carries `mark` in its extra metadata, with the mark's value."""
    schemas = openapi.components.schemas if openapi.components else None
    for struct in structs(kinds):
        component = (schemas or {}).get(struct.cls.__name__)
        if not isinstance(component, Schema):
            continue
        for field in struct.fields:
            target = (component.properties or {}).get(field.encode_name)
            value = declared(field.type).get(mark)
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


def write_limits_into_schema(
    openapi: OpenAPI, settings: Settings, request_types: Iterable[type]
) -> None:
    """Put the configured limits where the schema holds the types' ceilings: the route limits on
    their fields, the body limits on every string, array and object of a request body that
    has no tighter bound, and in the description what JSON Schema cannot say (depth, values)."""
    schemas = openapi.components.schemas if openapi.components else None
    if not schemas:
        return
    openapi.info.description = f"{openapi.info.description or ''}\n\n{body_limits_text(settings)}"
    seen: set[int] = set()
    for path in (openapi.paths or {}).values():
        for operation in (path.post, path.put, path.patch, path.delete):
            body = getattr(operation, "request_body", None)
            for media in (getattr(body, "content", None) or {}).values():
                _bound_body_schema(media.schema, schemas, settings, seen)
    for kind in request_types:
        for limit in limits_of(kind):
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


def body_limits_text(settings: Settings) -> str:
    """What every JSON body must keep to, as the OpenAPI description says it."""
    rows = [
        ("bytes", settings.max_request_bytes, "max_request_bytes", "(413 past it)"),
        ("levels of nesting", settings.max_json_depth, "max_json_depth", ""),
        ("array items and object members in all", settings.max_json_values, "max_json_values", ""),
        ("items in one array", settings.max_json_items, "max_json_items", ""),
        ("members of one object", settings.max_json_keys, "max_json_keys", ""),
        (
            "characters in one string or key",
            settings.max_json_string_chars,
            "max_json_string_chars",
            "",
        ),
    ]
    lines = "\n".join(
        f"- {bound:,} {what} ({env_name(name)}){' ' + note if note else ''}"
        for what, bound, name, note in rows
    )
    return (
        "Every request body is JSON, sent as `application/json` (else 415), each key given "
        f"once, and at most:\n{lines}\n\nPast one of these, or past a route's own limit, the "
        "answer is a 400 naming the field, the limit and its variable."
    )


def _bound_body_schema(
    schema: Any, schemas: dict[str, Any], settings: Settings, seen: set[int]
) -> None:
    """Give every string, array and object below `schema` the body limits where its own
    bound is missing or looser."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if hasattr(node, "ref") and isinstance(node.ref, str):
            node = schemas.get(node.ref.rsplit("/", 1)[-1])
        if not isinstance(node, Schema) or id(node) in seen:
            continue
        seen.add(id(node))
        kind = getattr(node.type, "value", None)
        if kind == "string":
            node.max_length = min(node.max_length or 10**12, settings.max_json_string_chars)
        elif kind == "array":
            node.max_items = min(node.max_items or 10**12, settings.max_json_items)
        elif kind == "object":
            node.max_properties = min(node.max_properties or 10**12, settings.max_json_keys)
        pending.extend(node.any_of or [])
        pending.extend((node.properties or {}).values())
        pending.extend(x for x in (node.items, node.additional_properties) if x is not None)
