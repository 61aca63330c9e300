"""Unit tests run in this process on fakes: no model files, no subprocess. A test that needs
either belongs in tests/integration, and this guard says so."""

from __future__ import annotations

import contextlib
import subprocess

import pytest
import tokenizers
import transformers

# matplotlib builds its font cache on first import by running fc-list: let it, here, before any
# test's guard is in place, so that the first plotting test on a fresh machine is not refused.
with contextlib.suppress(ImportError):  # without the eval extra there is no matplotlib
    import matplotlib.font_manager  # noqa: F401

#: What reads or writes a model or tokenizer folder.
LOADERS = (
    (transformers.PreTrainedModel, "from_pretrained"),
    (transformers.PreTrainedModel, "save_pretrained"),
    (transformers.PreTrainedTokenizerBase, "from_pretrained"),
    (transformers.PreTrainedTokenizerBase, "save_pretrained"),
    (tokenizers.Tokenizer, "from_file"),
)

#: Fixtures that build model folders on disk (tests/conftest.py).
MODEL_FIXTURES = {
    "model_dir",
    "tiny_embedder_path",
    "tiny_reranker_path",
    "embedder",
    "scorer",
    "settings",
    "e5_small_path",
}


@pytest.fixture(autouse=True)
def _in_process_without_model_files(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    used = MODEL_FIXTURES & set(request.fixturenames)
    if used:
        names = ", ".join(sorted(used))
        pytest.fail(f"a unit test uses model files ({names}): move it to tests/integration")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test starts no subprocess: move it to tests/integration")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)

    def no_model_files(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            "a unit test reads or writes no model files: move it to tests/integration"
        )

    for owner, name in LOADERS:
        monkeypatch.setattr(owner, name, no_model_files)
