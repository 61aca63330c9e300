"""What the layering promises at run time, in a fresh interpreter: light modules import no
torch, and `ragrank --help` loads no model code."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _loaded(code: str) -> set[str]:
    """The top-level packages loaded after running `code` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return set(result.stdout.split())


@pytest.mark.parametrize(
    "modules",
    [
        "indexing.pipeline, server.routes.search, server.routes.embeddings, ragrank.settings",
        "ragrank.protocols, ragrank.beir, ragrank.store, indexing",
        "eval.options, eval.bench.options, ragrank.options, ragrank.reference",
        # What the tests and the benchmarks share, and the command's root, load no model code
        # until something runs (their imports of the doors sit in functions).
        "eval.bench.harness, eval.systems, cli",
    ],
)
def test_light_modules_import_no_torch(modules: str):
    loaded = _loaded(f"import {modules}")
    assert "torch" not in loaded
    assert "transformers" not in loaded


def test_the_command_line_parser_loads_no_model_code():
    loaded = _loaded("from cli import build_parser\nbuild_parser().format_help()")
    assert not loaded & {"torch", "transformers", "sentence_transformers", "litestar"}


def test_the_probe_sees_torch_when_it_is_imported():
    assert "torch" in _loaded("import ragrank.backends.models")
