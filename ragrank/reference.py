"""The configuration reference, `docs/configuration.md`, generated from the settings' own docs
so that it cannot drift from the code: `make docs` writes it, and a test fails when it is stale."""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any

from ragrank.options import flag_name
from ragrank.settings import (
    Settings,
    bounds,
    choices_of,
    env_name,
    range_text,
    shown_default,
)

#: Where `make docs` writes the reference, relative to the repository.
REFERENCE = Path("docs/configuration.md")

_INTRO = """\
# Configuration

Every setting is an environment variable, read once at start-up into one frozen `Settings`
object. Command-line flags override them (`ragrank serve --help`); the app factory
`create_app(settings, services=...)` reads no environment itself. A malformed value stops the
program with a message naming the variable.

This page is generated from `ragrank/settings.py` by `make docs`.

| variable | default | allowed | meaning |
| --- | --- | --- | --- |
"""


def render() -> str:
    """The whole reference page, one table row per setting."""
    rows = []
    hints = typing.get_type_hints(Settings)
    for field in dataclasses.fields(Settings):
        doc = str(field.metadata.get("help", "")).replace("|", "\\|")
        rows.append(
            f"| `{env_name(field.name)}` | {shown_default(field)} | "
            f"{_allowed(field, hints[field.name])} | {doc} |"
        )
    return _INTRO + "\n".join(rows) + "\n"


def _allowed(field: dataclasses.Field[Any], kind: Any) -> str:
    """The field's choices or range, and its flag, as declared on it."""
    parts = []
    if choices := choices_of(kind):
        parts.append(", ".join(f"`{choice}`" for choice in choices))
    if text := range_text(*bounds(field)):
        parts.append(text)
    if field.metadata.get("group"):
        parts.append(f"flag `{flag_name(field)}`")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """`python -m ragrank.reference [PATH]`: write the reference (default docs/configuration.md)."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else REFERENCE
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
