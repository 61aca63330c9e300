"""Real `ragrank serve` processes on loopback, for the tests that talk to one over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

import httpx

from eval.bench.load import free_port

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence


@contextmanager
def ragrank_serve(
    flags: Sequence[str], env: Mapping[str, str], *, ready_within_s: float = 120
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`ragrank serve` with `flags` on a free port, once `/ready` answers 200: (base URL,
    process). Leaving stops it with SIGINT, as Ctrl-C would; its exit status is then set."""
    port = free_port()
    command = [sys.executable, "-m", "ragrank.cli", "serve", "--port", str(port), *flags]
    server = subprocess.Popen(
        command,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_within_s
        while True:
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"server not ready within {ready_within_s} s"
            time.sleep(0.5)
        yield base, server
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
