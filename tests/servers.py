"""Real `ragrank serve` processes on loopback, for the tests that talk to one over HTTP."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from eval.bench.harness import free_port, ragrank_command, server_process

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator, Mapping, Sequence


@contextmanager
def ragrank_serve(
    flags: Sequence[str], env: Mapping[str, str], *, ready_within_s: float = 120
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`ragrank serve` with `flags` on a free port, once `/ready` answers 200: (base URL,
    process). Leaving stops it with SIGINT, as Ctrl-C would; its exit status is then set."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with (
        tempfile.TemporaryDirectory(prefix="ragrank-serve-") as folder,
        server_process(
            ragrank_command("serve", "--port", str(port), *flags),
            {**os.environ, "HF_HUB_OFFLINE": "1", **env},
            base + "/ready",
            Path(folder) / "server.log",
            ready_within_s=ready_within_s,
        ) as process,
    ):
        yield base, process
