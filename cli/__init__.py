"""The composition root: the `ragrank` command, the one package that wires the front doors
(`server`, `indexing`, `eval`) onto the core. No package imports it; the tests drive the
command through it."""

from __future__ import annotations

from cli.main import build_parser, main, settings_from_args
from cli.stack import run_stack, stack_app

__all__ = [
    "build_parser",
    "main",
    "run_stack",
    "settings_from_args",
    "stack_app",
]
