from __future__ import annotations

import subprocess
import sys

import pytest

from ragrank.cli import build_parser, main, settings_from_args


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


def test_the_console_script_is_installed():
    result = subprocess.run(
        [sys.executable, "-m", "ragrank.cli", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert "serve" in result.stdout and "index" in result.stdout and "demo" in result.stdout


def test_flags_override_the_environment(monkeypatch):
    monkeypatch.setenv("RAGRANK_PORT", "9000")
    monkeypatch.setenv("RAGRANK_COLLECTION", "from-env")
    args = build_parser().parse_args(["serve", "--port", "9100"])
    settings = settings_from_args(args)
    assert (settings.port, settings.collection) == (9100, "from-env")


def test_index_of_a_missing_path_fails_with_a_message_not_a_trace(tmp_path, settings, capsys):
    code = main(
        [
            "index",
            str(tmp_path / "nope.jsonl"),
            "--embed-model",
            settings.embed_model,
            "--qdrant-path",
            str(tmp_path / "q"),
            "--device",
            "cpu",
            "--no-progress",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "ragrank: error:" in err and "does not exist" in err
    assert "Traceback" not in err


def test_eval_without_its_extra_names_the_package_to_install(monkeypatch, capsys, tmp_path):
    for name in [m for m in sys.modules if m.startswith("eval.") and m != "eval.beir"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "faiss", None)  # as if faiss were not installed
    assert main(["eval", "--dataset", str(tmp_path)]) == 2
    assert "pip install 'ragrank[eval]'" in capsys.readouterr().err


def test_models_check_reports_each_model_and_fails_when_one_does_not_load(settings, capsys):
    flags = ["--embed-model", settings.embed_model, "--device", "cpu"]
    assert main(["models", "check", *flags, "--rerank-model", settings.rerank_model]) == 0
    out = capsys.readouterr().out
    assert f"ok    embedding: {settings.embed_model} (RAGRANK_EMBED_MODEL) from local folder" in out
    assert "dimension 32, max length 512" in out
    assert f"ok    reranking: {settings.rerank_model}" in out

    assert main(["models", "check", *flags, "--rerank-model", "/nonexistent/reranker"]) == 1
    out = capsys.readouterr().out
    assert "ok    embedding" in out
    assert "FAIL  reranking: /nonexistent/reranker (RAGRANK_RERANK_MODEL)" in out


def test_models_pull_skips_local_folders_and_names_the_setting_when_the_hub_fails(
    settings, capsys, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    local = ["--embed-model", settings.embed_model, "--rerank-model", settings.rerank_model]
    assert main(["models", "pull", *local]) == 0
    assert capsys.readouterr().out.count("nothing to pull") == 2
    hub = ["--embed-model", settings.embed_model, "--rerank-model", "BAAI/no-such-reranker"]
    assert main(["models", "pull", *hub]) == 2
    err = capsys.readouterr().err
    assert "'BAAI/no-such-reranker'" in err and "RAGRANK_RERANK_MODEL" in err
