from __future__ import annotations

import sys

import pytest

from cli import build_parser, main, settings_from_args


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("serve", ["--host", "--port", "--embed-model", "--qdrant-url"]),
        ("index", ["path", "--chunk-tokens", "--batch-size", "JSONL"]),
        ("demo", ["--no-serve", "--preset", "small"]),
        ("eval", ["--dataset", "--systems", "--candidates", "--limit-queries", "--cache-dir"]),
    ],
)
def test_each_subcommand_has_useful_help(command, expected, capsys):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for word in expected:
        assert word in text


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("reranker", ["--base", "--held-out-split", "--negatives", "listnet", "RAGRANK_RERANK"]),
        ("embedder", ["--base", "--held-out-split", "mnrl", "prefixes", "RAGRANK_EMBED_MODEL"]),
    ],
)
def test_finetune_has_useful_help(model, expected, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["finetune", model, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for word in expected:
        assert word in text


def test_finetune_without_its_extra_names_the_package_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if datasets were not installed
    flags = ["--dataset", str(tmp_path), "--output", str(tmp_path / "out")]
    assert main(["finetune", "reranker", *flags]) == 2
    assert "pip install 'ragrank[finetune]'" in capsys.readouterr().err


def test_flags_override_the_environment(monkeypatch):
    monkeypatch.setenv("RAGRANK_PORT", "9000")
    monkeypatch.setenv("RAGRANK_COLLECTION", "from-env")
    args = build_parser().parse_args(["serve", "--port", "9100"])
    settings = settings_from_args(args)
    assert (settings.port, settings.collection) == (9100, "from-env")


def test_eval_without_its_extra_names_the_package_to_install(monkeypatch, capsys, tmp_path):
    light = ("eval.options", "eval.bench", "eval.bench.options")  # what --help itself imports
    for name in [m for m in sys.modules if m.startswith("eval.") and m not in light]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "faiss", None)  # as if faiss were not installed
    assert main(["eval", "--dataset", str(tmp_path)]) == 2
    assert "pip install 'ragrank[eval]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "groups"),
    [
        (["serve"], ("models", "listen")),
        (["demo"], ("models", "listen")),
        (["index", "corpus.jsonl"], ("models", "index")),
        (["worker"], ("models", "worker")),
        (["models", "check"], ("models",)),
    ],
)
def test_a_commands_settings_flags_are_the_fields_of_its_groups(argv, groups, monkeypatch):
    import os

    from ragrank.options import flag_name, setting_fields
    from ragrank.settings import Settings

    for name in [k for k in os.environ if k.startswith("RAGRANK_")]:
        monkeypatch.delenv(name)
    fields = [f for group in groups for f in setting_fields(group)]
    command = build_parser()._subparsers._group_actions[0].choices[argv[0]]  # type: ignore[union-attr]
    flags = {o for action in command._actions for o in action.option_strings}
    assert {flag_name(f) for f in fields} <= flags
    # Absent, a flag leaves the setting alone; given, it sets the field of its own name.
    args = build_parser().parse_args(argv)
    assert settings_from_args(args) == Settings.from_env()
    given = [f for f in fields if f.type in ("int", "str")]
    for field in given:
        value = "17" if field.type == "int" else "given-value"
        args = build_parser().parse_args([*argv, flag_name(field), value])
        assert getattr(args, field.name) == (17 if field.type == "int" else value)
