"""Command-line flags built from a dataclass's fields (`ragrank.fieldspec.option`), so that
each option's or setting's name, type, default and help are written once, on the field.

A field becomes `--field-name`. Its type picks the parsing: `int`, `float`, `str`, `Path`, a
`Literal` (choices), `X | None` (absent: the default), `tuple[X, ...]` (values separated by
spaces or commas, or a repeated flag with `repeat=True`), and `bool` (`--name` when the default
is False, `--no-name` when it is True). A field whose default comes from a setting names it
(`setting="fusion"`): the flag then defaults to that setting's value. Fields with `cli=False`
are filled by the caller. A setting's flag (`group=`) defaults to nothing, leaving the
environment's value, and says its variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from ragrank.errors import SettingsError
from ragrank.fieldspec import FlagGroup, option
from ragrank.settings import Settings, env_name

if typing.TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "add_options",
    "add_setting_flags",
    "cli_fields",
    "flag_name",
    "option",
    "options_from_args",
    "parse_options",
    "setting_fields",
    "settings_overrides",
]

_Options = TypeVar("_Options")

#: Sentinel: a flag the user did not give, told apart from one given as its default.
_UNSET: Any = object()


def flag_name(field: dataclasses.Field[Any]) -> str:
    """The flag of an options field: `--learning-rate` for `learning_rate`."""
    given: str | None = field.metadata.get("flag")
    if given:
        return given
    if field.type in ("bool", bool) and field.default is True:
        return "--no-" + field.name.replace("_", "-")
    return "--" + field.name.replace("_", "-")


def cli_fields(options: type[Any]) -> list[dataclasses.Field[Any]]:
    """The fields of an options dataclass that have a flag."""
    return [f for f in dataclasses.fields(options) if f.metadata.get("cli", True)]


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    options: type[Any],
    *,
    defaults: Mapping[str, Any] | None = None,
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> None:
    """Add one flag per field of `options`. `defaults` and `choices` override a field's, for
    commands that share one dataclass with different defaults (the two fine-tuning roles)."""
    hints = typing.get_type_hints(options)
    for field in cli_fields(options):
        default = (defaults or {}).get(field.name, field.default)
        allowed = (choices or {}).get(field.name, field.metadata.get("choices"))
        _add_flag(parser, field, hints[field.name], default, allowed)


def options_from_args(
    options: type[_Options],
    args: argparse.Namespace,
    settings: Settings | None = None,
    **given: Any,
) -> _Options:
    """Build `options` from parsed flags; fields with `setting=` take the setting's value when
    the flag was not given, and `given` fills the fields without a flag."""
    values: dict[str, Any] = dict(given)
    for field in cli_fields(options):
        value = getattr(args, field.name, _UNSET)
        setting = field.metadata.get("setting")
        if value is None and setting is not None:
            if settings is None:
                raise SettingsError(f"{flag_name(field)} defaults to a setting: pass settings")
            value = getattr(settings, setting)
        if value is None and field.metadata["repeat"]:
            continue
        if isinstance(value, list):
            # nargs="+" of comma-separated parts gives a list of tuples.
            value = tuple(
                v for part in value for v in (part if isinstance(part, tuple) else (part,))
            )
        if value is not _UNSET:
            values[field.name] = value
    return options(**values)


def setting_fields(group: FlagGroup) -> list[dataclasses.Field[Any]]:
    """The settings whose flag belongs to `group`, in declaration order."""
    return [f for f in dataclasses.fields(Settings) if f.metadata.get("group") == group]


def add_setting_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, group: FlagGroup
) -> None:
    """One flag per setting of `group`, built as every option's flag is; absent, it leaves the
    environment's value (`settings_overrides`)."""
    hints = typing.get_type_hints(Settings)
    for field in setting_fields(group):
        _add_flag(parser, field, hints[field.name], None, None, variable=env_name(field.name))


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Every settings flag the command has and the user gave, by field name."""
    given = {}
    for field in dataclasses.fields(Settings):
        if field.metadata.get("group") is not None:
            value = getattr(args, field.name, None)
            if value is not None:
                given[field.name] = value
    return given


def parse_options(
    options: type[_Options],
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str | None,
    settings: Settings | None = None,
) -> _Options:
    """A program whose flags are exactly the fields of `options` (the benchmarks' `main`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_options(parser, options)
    return options_from_args(options, parser.parse_args(argv), settings)


def _add_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    field: dataclasses.Field[Any],
    hint: Any,
    default: Any,
    choices: tuple[str, ...] | None,
    *,
    variable: str | None = None,
) -> None:
    """One field's flag. With `variable` (a setting's), the flag defaults to nothing and its
    help names the variable: the first clause of the setting's help, as plain text."""
    meta = field.metadata
    kind = _unwrap_optional(hint)
    required = default is dataclasses.MISSING
    spec: dict[str, Any] = {"dest": field.name, "help": meta["help"]}
    if variable is not None:
        spec["help"] = f"{str(meta['help']).split(';')[0].replace('`', '')} ({variable})"
    if meta["metavar"]:
        spec["metavar"] = meta["metavar"]
    if kind is bool:
        spec["action"] = "store_false" if default is True else "store_true"
        spec.pop("metavar", None)
    else:
        spec.update(_value_spec(kind, field, choices))
        if required:
            spec["required"] = True
        elif variable is not None:
            spec["default"] = None
        elif meta["setting"] is not None:
            spec["default"] = None
            spec["help"] += f" (default: {env_name(meta['setting'])})"
        else:
            # A repeated flag starts from nothing: argparse would append to the default.
            spec["default"] = None if meta["repeat"] else default
            if default not in (None, ()):
                spec["help"] += f" (default: {_shown(default)})"
    parser.add_argument(flag_name(field), **spec)
    if meta["none_flag"]:
        off, off_help = meta["none_flag"]
        parser.add_argument(off, dest=field.name, action="store_const", const=None, help=off_help)


def _value_spec(
    kind: Any, field: dataclasses.Field[Any], choices: tuple[str, ...] | None
) -> dict[str, Any]:
    """type=, choices= (and how a tuple is read) for one field's flag."""
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        if field.metadata["repeat"]:
            return {"action": "append", "type": _converter(item)}
        name = field.metadata["metavar"] or field.name.upper().removesuffix("S")
        return {"nargs": "+", "metavar": name, "type": _comma_separated(_converter(item), choices)}
    if typing.get_origin(kind) is Literal:
        return {"choices": choices or typing.get_args(kind)}
    spec: dict[str, Any] = {"type": _converter(kind)}
    if choices:
        spec["choices"] = choices
    return spec


def _converter(kind: Any) -> Callable[[str], Any]:
    if kind in (int, float, str, Path):
        converter: Callable[[str], Any] = kind
        return converter
    raise TypeError(f"no flag for a field of type {kind!r}")


def _comma_separated(
    item: Callable[[str], Any], choices: tuple[str, ...] | None
) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        values = tuple(item(part.strip()) for part in text.split(",") if part.strip())
        unknown = [value for value in values if choices and value not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(str, unknown))}; choose from {', '.join(choices or ())}"
            )
        return values

    return parse


def _unwrap_optional(hint: Any) -> Any:
    """X for `X | None`, else the hint itself."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(members) == 1:
            return members[0]
    return hint


def _shown(default: Any) -> str:
    if isinstance(default, tuple):
        return ",".join(map(str, default)) or "none"
    return str(default)
