"""Unit tests run in this process on fakes: no model files, no subprocess. A test that needs
either belongs in tests/integration, and this guard says so."""

from __future__ import annotations

import contextlib
import subprocess
from typing import TYPE_CHECKING

import pytest
import tokenizers
import transformers

if TYPE_CHECKING:
    from collections.abc import Iterator

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

#: Where every fixture of tests/conftest.py that builds or reads model files puts them: the
#: shared folder of tiny models, and the real e5-small build. A test uses model files when its
#: fixtures reach either at any depth (`request.fixturenames` is that closure), so a new
#: model fixture is caught without being listed here.
MODEL_FOLDERS = {"model_dir", "e5_small_path"}


@pytest.fixture(scope="package", autouse=True)
def _no_model_files_or_subprocesses() -> Iterator[None]:
    """For the whole unit package, module- and class-scoped fixtures included: no subprocess,
    and no model or tokenizer folder read or written."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test starts no subprocess: move it to tests/integration")

    def no_model_files(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            "a unit test reads or writes no model files: move it to tests/integration"
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", refuse)
        for owner, name in LOADERS:
            patch.setattr(owner, name, no_model_files)
        yield


@pytest.fixture(autouse=True)
def _no_model_fixtures(request: pytest.FixtureRequest) -> None:
    """Model fixtures are session-wide: one another worker's test already built is cached,
    and would load nothing here for the guard to see."""
    used = MODEL_FOLDERS & set(request.fixturenames)
    if used:
        names = ", ".join(sorted(used))
        pytest.fail(f"a unit test uses model files (through {names}): move it to tests/integration")
