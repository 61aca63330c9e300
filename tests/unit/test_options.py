"""Flags built from an options dataclass (ragrank/options.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from ragrank.options import add_options, option, options_from_args
from ragrank.settings import Settings


@dataclass(frozen=True)
class Example:
    target: Path = option(help="where to")
    names: tuple[str, ...] = option(("a", "b"), "which names", choices=("a", "b", "c"))
    folders: tuple[Path, ...] = option((), "repeat it", flag="--folder", repeat=True)
    limit: int | None = option(None, "at most N", metavar="N")
    cache: Path | None = option(Path("cache"), "the cache", none_flag=("--no-cache", "none"))
    mode: Literal["fast", "slow"] = option("fast", "how")
    fusion: str = option("rrf", "from a setting", setting="fusion")
    progress: bool = option(True, "hide progress")
    verbose: bool = option(False, "say more")
    internal: int = option(7, cli=False)


def _parse(argv: list[str], settings: Settings | None = None, **given: object) -> Example:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_options(parser, Example)
    return options_from_args(Example, parser.parse_args(argv), settings or Settings(), **given)


def test_defaults_come_from_the_fields_and_settings():
    parsed = _parse(["--target", "x"], Settings(fusion="dbsf"))
    assert parsed == Example(target=Path("x"), fusion="dbsf")


def test_each_kind_of_field_parses_its_flag():
    parsed = _parse(
        [
            *["--target", "x", "--names", "c,a", "b", "--folder", "p", "--folder", "q"],
            *["--limit", "3", "--no-cache", "--mode", "slow", "--fusion", "dbsf"],
            *["--no-progress", "--verbose"],
        ],
        internal=9,
    )
    assert parsed.names == ("c", "a", "b")
    assert parsed.folders == (Path("p"), Path("q"))
    assert (parsed.limit, parsed.cache, parsed.mode, parsed.fusion) == (3, None, "slow", "dbsf")
    assert (parsed.progress, parsed.verbose, parsed.internal) == (False, True, 9)


@pytest.mark.parametrize(
    "argv",
    [
        [],  # --target is required
        ["--target", "x", "--names", "z"],  # not a choice
        ["--target", "x", "--mode", "medium"],
        ["--target", "x", "--limit", "many"],
        ["--target", "x", "--internal", "3"],  # no flag
    ],
)
def test_bad_flags_are_refused(argv: list[str]):
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parse(argv)


def test_the_help_shows_each_default_once():
    parser = argparse.ArgumentParser()
    add_options(parser, Example)
    text = " ".join(parser.format_help().split())
    assert "which names (default: a,b)" in text
    assert "from a setting (default: RAGRANK_FUSION)" in text
    assert "--no-progress hide progress" in text
    assert "--internal" not in text


def test_a_mutable_default_is_refused():
    with pytest.raises(TypeError, match="tuple"):
        option([1], "no")
