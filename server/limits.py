"""The configured request limits (`RAGRANK_MAX_*`), in two layers. The body limits bound the
shape of any JSON body (depth, values, arrays, objects, strings) before it is decoded into a
route's type; the route limits bound that type's fields. Both are written into the OpenAPI
schema the server serves, so the schema and the server say the same."""

from __future__ import annotations

import contextlib
import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from litestar.openapi.spec import OpenAPI, Schema

from ragrank.errors import InvalidRequestError
from ragrank.ids import doc_id_problem
from ragrank.settings import LIMIT_CEILINGS, Settings, env_name

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable, Iterator


#: What a route limit bounds, by the type of the field it is declared on.
LimitKind = Literal["chars", "items", "value"]


@dataclass(frozen=True)
class Limit:
    """`setting` bounds the `kind` of `field` (dotted; `[]` for every item of a list)."""

    field: str
    kind: LimitKind
    setting: str


def length_limit(setting: str, **meta: Any) -> msgspec.Meta:
    """The `Meta` of a string or list field bounded by the request limit `setting`: its type
    holds the limit's ceiling, and the configured value is checked on top (`check_limits`)
    and written into the served schema."""
    return msgspec.Meta(max_length=LIMIT_CEILINGS[setting], extra={"limit": setting}, **meta)


def value_limit(setting: str, **meta: Any) -> msgspec.Meta:
    """The `Meta` of an integer field bounded by the request limit `setting`."""
    return msgspec.Meta(le=LIMIT_CEILINGS[setting], extra={"limit": setting}, **meta)


def limits_of(kind: type) -> tuple[Limit, ...]:
    """The route limits declared on the fields of a request type, nested structs included."""
    return _limits_of(kind)


@functools.cache
def _limits_of(kind: Hashable) -> tuple[Limit, ...]:
    found: list[Limit] = []
    _walk(msgspec.inspect.type_info(kind), "", found, set())
    return tuple(found)


_KINDS: dict[type, LimitKind] = {
    msgspec.inspect.StrType: "chars",
    msgspec.inspect.ListType: "items",
    msgspec.inspect.IntType: "value",
}


def _walk(node: Any, path: str, found: list[Limit], seen: set[type]) -> None:
    if isinstance(node, msgspec.inspect.Metadata):
        setting = (node.extra or {}).get("limit")
        if setting is not None:
            found.append(Limit(path, _KINDS[type(node.type)], setting))
        _walk(node.type, path, found, seen)
    elif isinstance(node, msgspec.inspect.UnionType):
        for alternative in node.types:
            _walk(alternative, path, found, seen)
    elif isinstance(node, msgspec.inspect.ListType):
        _walk(node.item_type, path + "[]", found, seen)
    elif isinstance(node, msgspec.inspect.StructType) and node.cls not in seen:
        seen.add(node.cls)
        for field in node.fields:
            _walk(
                field.type,
                f"{path}.{field.encode_name}" if path else field.encode_name,
                found,
                seen,
            )
        seen.discard(node.cls)


_ABSENT: Any = object()
_UNITS = {"chars": "characters", "items": "items", "value": ""}

#: A JSON string, escapes and all; blanked out before the body's structure is counted.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_WHITESPACE = b" \t\n\r"


def decode_body(raw: bytes, settings: Settings) -> Any:
    """The JSON value of `raw`, once it is within the body limits; else a 400 naming the
    limit, its variable and, where there is one, the field.

    Values are counted on the bytes, with strings blanked out, before anything is decoded, so a
    body of millions of tiny values costs no more than its bytes. The decoded value is then
    walked without recursion for depth, arrays, objects and strings; a body nested past the
    decoder's own recursion limit is past any allowed depth."""
    skeleton = _STRING.sub(b'""', raw).translate(None, _WHITESPACE)
    values = sum(map(skeleton.count, (b",", b"[", b"{"))) - sum(map(skeleton.count, (b"[]", b"{}")))
    _check(values, settings, "max_json_values", "", "array items and object members in all")
    try:
        value = msgspec.json.decode(raw)
    except RecursionError:
        raise _too_deep(settings, "") from None
    except msgspec.ValidationError as exc:
        # Untyped, only a number can be invalid: past float range, or an integer too long.
        reason = str(exc).split(" - at ", 1)[0]
        raise InvalidRequestError(f"the body holds a number out of range: {reason}") from None
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"the body is not valid JSON: {exc}") from None
    members = _check_shape(value, settings)
    if skeleton.count(b'"":') > members:
        raise _duplicate_key(raw)
    return value


def _check_shape(value: Any, settings: Settings) -> int:
    """Walk `value` for the body limits; the object members it holds."""
    chars, depth_bound = settings.max_json_string_chars, settings.max_json_depth
    if isinstance(value, str):
        _check(len(value), settings, "max_json_string_chars", "", "characters")
    members = 0
    pending: list[tuple[Any, int, str]] = [(value, 1, "")]
    while pending:
        node, depth, path = pending.pop()
        if isinstance(node, dict):
            _check(len(node), settings, "max_json_keys", path, "members")
            members += len(node)
            items: Any = node.items()
        elif isinstance(node, list):
            _check(len(node), settings, "max_json_items", path, "items")
            items = enumerate(node)
        else:
            continue
        for key, item in items:
            if isinstance(key, str) and len(key) > chars:
                _check(len(key), settings, "max_json_string_chars", path, "characters in a key")
            if isinstance(item, str):
                if len(item) > chars:
                    where = _child(path, key)
                    _check(len(item), settings, "max_json_string_chars", where, "characters")
            elif isinstance(item, dict | list):
                if depth >= depth_bound:
                    raise _too_deep(settings, _child(path, key))
                pending.append((item, depth + 1, _child(path, key)))
    return members


def _child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _check(size: int, settings: Settings, setting: str, path: str, unit: str) -> None:
    bound: int = getattr(settings, setting)
    if size > bound:
        where = f"{path}: " if path else "the body: "
        raise InvalidRequestError(
            f"{where}at most {bound:,} {unit}, got {size:,} ({env_name(setting)})",
            field=path or None,
        )


def _too_deep(settings: Settings, path: str) -> InvalidRequestError:
    where = f"{path}: " if path else ""
    return InvalidRequestError(
        f"{where}the body nests arrays and objects deeper than {settings.max_json_depth} levels "
        f"({env_name('max_json_depth')})",
        field=path.split(".", 1)[0].split("[", 1)[0] or None,
    )


def _duplicate_key(raw: bytes) -> InvalidRequestError:
    """A 400 naming the first key given twice in one object: readers disagree on which of the
    two counts, so neither does. Only a body known to hold one is parsed again here."""
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen and not found:
                found.append(key)
            seen.add(key)
        return {}

    with contextlib.suppress(ValueError):  # msgspec read it, so this one will too
        json.loads(raw, object_pairs_hook=pairs)
    key = found[0] if found else ""
    return InvalidRequestError(
        f"{key[:100]}: a key appears twice in one object; give each key once", field=key or None
    )


def check_limits(body: Any, settings: Settings) -> None:
    """A 400 naming the field, the limit and its variable for the first limit `body` breaks."""
    where = getattr(body, "filter", None)
    if isinstance(where, dict) and isinstance(where.get("doc_id"), str):
        problem = doc_id_problem(where["doc_id"])
        if problem:
            raise InvalidRequestError(f"filter.doc_id: {problem}", field="filter.doc_id")
    for limit in limits_of(type(body)):
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
    """(path, value) of each value at `field`; an alternative of a union without the field
    (a text where a document object could be) has none."""
    name, _, rest = field.partition(".")
    value = getattr(body, name.removesuffix("[]"), _ABSENT)
    if value is _ABSENT:
        return
    if not name.endswith("[]"):
        if rest:
            yield from ((f"{name}.{p}", v) for p, v in _values(value, rest))
        else:
            yield name, value
        return
    if not isinstance(value, list):
        return
    for index, item in enumerate(value):
        path = f"{name[:-2]}[{index}]"
        if rest:
            yield from ((f"{path}.{p}", v) for p, v in _values(item, rest))
        else:
            yield path, item


def _size(value: Any, kind: str) -> int | None:
    if kind == "value":
        return int(value)
    if kind == "items":
        return len(value) if isinstance(value, list) else None
    return len(value) if isinstance(value, str) else None


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
