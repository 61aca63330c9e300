"""One declaration for every field a person sets by flag or variable: the options of the
commands and benchmarks (their flags built by `ragrank/options.py`) and the settings
(`ragrank/settings.py`, read from `RAGRANK_*` variables, some with a flag too). One vocabulary
for both: `help`, `flag`, `choices`, `ge`/`le`, ... Validation, the flags, the configuration
reference (`make docs`) and the OpenAPI schema's ceilings all read what a field declares."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

#: The groups of settings flags a command can offer (`cli/main.py` says which command offers
#: each group).
FlagGroup = Literal["models", "listen", "index", "worker"]


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    repeat: bool = False,
    none_flag: tuple[str, str] | None = None,
    setting: str | None = None,
    cli: bool = True,
    group: FlagGroup | None = None,
    ge: float | None = None,
    le: float | None = None,
    shown: str | None = None,
    empty_is_value: bool = False,
    secret: bool = False,
) -> Any:
    """A dataclass field that says what it does (`help`) and how it is set.

    For an option: its flag is `--field-name` (or `flag`), with `choices`, `metavar`, `repeat`
    (a repeated flag), `none_flag` ((flag, help) of a second flag that sets it to None, e.g.
    `--no-cache`), `setting` (the setting whose value it takes when the flag is absent) and
    `cli=False` (no flag: the caller fills it).

    For a setting: `group` names the commands whose flag sets it; `ge` and `le` bound it (a
    `Literal` type gives its choices); `shown` says how its default reads when the value alone
    would mislead (`0` meaning "per device"); `empty_is_value` keeps an empty variable as the
    empty string; `secret` keeps it out of `repr`."""
    metadata = {
        "help": help,
        "flag": flag,
        "choices": choices,
        "metavar": metavar,
        "repeat": repeat,
        "none_flag": none_flag,
        "setting": setting,
        "cli": cli,
        "group": group,
        "ge": ge,
        "le": le,
        "shown": shown,
        "empty_is_value": empty_is_value,
    }
    if isinstance(default, list | dict | set):
        raise TypeError("mutable defaults: use a tuple")
    return dataclasses.field(default=default, repr=not secret, metadata=metadata)
