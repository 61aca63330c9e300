"""A process's log lines: every library's records once, in the configured format."""

from __future__ import annotations

import json
import subprocess
import sys

#: Warns the way a model load without the hub does, after the process configured its logs.
_WARN = """
import logging, sys
from ragrank.logs import configure_logging
configure_logging(sys.argv[1], "INFO")
from huggingface_hub.utils import logging as hub_logging
hub_logging.get_logger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
from transformers.utils import logging as transformers_logging
transformers_logging.get_logger("transformers.modeling_utils").warning("weights were not used")
"""


def _stderr(log_format: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-c", _WARN, log_format],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return run.stderr.splitlines()


def test_a_library_warning_is_written_once_as_json():
    """huggingface_hub gives its logger a console handler of its own and propagates too, so
    each retry printed twice; transformers' logger does not propagate, so its warnings never
    reached the configured format."""
    written = _stderr("json")
    for logger, text in (
        ("huggingface_hub.utils._http", "Retry 1/5"),
        ("transformers.modeling_utils", "weights were not used"),
    ):
        lines = [line for line in written if text in line]
        assert len(lines) == 1, written
        assert json.loads(lines[0])["logger"] == logger


def test_a_library_warning_is_written_once_as_text():
    written = _stderr("text")
    lines = [line for line in written if "Retry 1/5" in line]
    assert len(lines) == 1, written
    assert " WARNING huggingface_hub.utils._http: " in lines[0]
