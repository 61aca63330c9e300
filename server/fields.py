"""One walk over the request types (msgspec structs and what their fields hold), shared by the
body guard, which reads the limits and rules declared on fields (`server/limits.py`), and by
the served schema's completion, which finds every struct a route takes (`server/openapi.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator


def walk(kind: Any) -> Iterator[tuple[str, Any]]:
    """(path, node) of every type node reachable from `kind`, fields in declared order: a
    field's path is dotted from the body (`documents[].text`, `[]` for a list's items, `{}` for
    a mapping's values), through unions and nested structs. A struct is not entered again below
    itself, so recursive types end."""
    inside: frozenset[type] = frozenset()
    pending: list[tuple[Any, str, frozenset[type]]] = [
        (msgspec.inspect.type_info(kind), "", inside)
    ]
    while pending:
        node, path, inside = pending.pop()
        yield path, node
        children: list[tuple[Any, str, frozenset[type]]] = []
        if isinstance(node, msgspec.inspect.Metadata):
            children = [(node.type, path, inside)]
        elif isinstance(node, msgspec.inspect.UnionType):
            children = [(alternative, path, inside) for alternative in node.types]
        elif isinstance(node, msgspec.inspect.ListType):
            children = [(node.item_type, path + "[]", inside)]
        elif isinstance(node, msgspec.inspect.DictType):
            children = [
                (node.key_type, path + "{}", inside),
                (node.value_type, path + "{}", inside),
            ]
        elif isinstance(node, msgspec.inspect.StructType) and node.cls not in inside:
            below = inside | {node.cls}
            children = [
                (field.type, f"{path}.{field.encode_name}" if path else field.encode_name, below)
                for field in node.fields
            ]
        pending.extend(reversed(children))


def structs(kinds: Iterable[type]) -> Iterator[msgspec.inspect.StructType]:
    """Each struct reachable from `kinds`, once."""
    seen: set[type] = set()
    for kind in kinds:
        for _, node in walk(kind):
            if isinstance(node, msgspec.inspect.StructType) and node.cls not in seen:
                seen.add(node.cls)
                yield node


def declared(node: Any) -> dict[str, Any]:
    """What a field's `Meta(extra=...)` declares, through an optional's union."""
    if isinstance(node, msgspec.inspect.Metadata):
        return dict(node.extra or {})
    if isinstance(node, msgspec.inspect.UnionType):
        merged: dict[str, Any] = {}
        for alternative in node.types:
            merged |= declared(alternative)
        return merged
    return {}
