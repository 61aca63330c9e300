"""The `ragrank` command where it loads model folders or runs as its own process."""

from __future__ import annotations

import subprocess
import sys

from cli import main


def test_the_console_script_is_installed():
    result = subprocess.run(
        [sys.executable, "-m", "cli", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert "serve" in result.stdout and "index" in result.stdout and "demo" in result.stdout


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
