"""The body guard's checks of the configured request limits (`RAGRANK_MAX_*`), in two layers.
The body limits bound the shape of any JSON body (depth, values, arrays, objects, strings)
before it is decoded into a route's type; the route limits, and the key rules such as search's
`filter.doc_id`, are declared on that type's fields and bound them. `server/openapi.py` writes
both into the served schema, so the schema and the server say the same."""

from __future__ import annotations

import contextlib
import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ragrank.errors import InvalidRequestError
from ragrank.ids import doc_id_problem
from ragrank.settings import LIMIT_CEILINGS, env_name
from server.fields import walk

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterator

    from ragrank.settings import Settings


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
    return tuple(
        Limit(path, _KINDS[type(node.type)], setting)
        for path, node, setting in _declared_on(kind, "limit")
    )


def _declared_on(kind: Any, name: str) -> Iterator[tuple[str, Any, Any]]:
    """(path, metadata node, value) of each field of `kind` whose `Meta(extra=...)` declares
    `name`. A mapping's values have no field path, so nothing is read there."""
    for path, node in walk(kind):
        if isinstance(node, msgspec.inspect.Metadata) and "{}" not in path:
            value = (node.extra or {}).get(name)
            if value is not None:
                yield path, node, value


_KINDS: dict[type, LimitKind] = {
    msgspec.inspect.StrType: "chars",
    msgspec.inspect.ListType: "items",
    msgspec.inspect.IntType: "value",
}

#: The rules a mapping field can declare for the value at one of its keys, by name: the
#: identifier rules that bodies and paths share (`ragrank/ids.py`).
KEY_RULES: dict[str, Callable[[str], str | None]] = {"doc_id": doc_id_problem}


def key_rules(**rules: str) -> dict[str, dict[str, str]]:
    """The `Meta(extra=...)` of a mapping field whose values at some keys follow a rule of
    `KEY_RULES`: `key_rules(doc_id="doc_id")` checks `filter.doc_id` as a document id."""
    unknown = set(rules.values()) - set(KEY_RULES)
    if unknown:
        raise ValueError(f"no such key rules: {', '.join(sorted(unknown))}")
    return {"key_rules": rules}


def key_rules_of(kind: type) -> tuple[tuple[str, str, str], ...]:
    """(field, key, rule) of each key rule declared on the fields of a request type."""
    return _key_rules_of(kind)


@functools.cache
def _key_rules_of(kind: Hashable) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (path, key, rule)
        for path, _, rules in _declared_on(kind, "key_rules")
        for key, rule in rules.items()
    )


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
    """A 400 naming the field, and the limit and its variable or the rule, for the first limit or
    key rule `body` breaks."""
    for field, key, rule in key_rules_of(type(body)):
        for path, value in _values(body, field):
            given = value.get(key) if isinstance(value, dict) else None
            problem = KEY_RULES[rule](given) if isinstance(given, str) else None
            if problem:
                raise InvalidRequestError(f"{path}.{key}: {problem}", field=f"{path}.{key}")
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
