"""Servers on loopback for the tests that talk to one over HTTP: real `ragrank serve`
processes, and an app of fakes served in this process. Both start the way the benchmarks'
harness starts its servers (`eval/bench/harness.py`): a free port, then `/ready`."""

from __future__ import annotations

import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import uvicorn

from eval.bench.harness import free_port, ragrank_command, server_process, wait_until_ready

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator, Mapping, Sequence
    from contextlib import AbstractContextManager

    from litestar import Litestar

_Started = TypeVar("_Started")


@contextmanager
def side_by_side(*managers: AbstractContextManager[_Started]) -> Iterator[list[_Started]]:
    """Enter `managers` at once, each in a thread of its own (a server spends seconds
    importing and loading), and leave, in the end, those that started."""
    with ExitStack() as stack:
        with ThreadPoolExecutor(len(managers)) as pool:
            started = [pool.submit(manager.__enter__) for manager in managers]
        for manager, future in zip(managers, started, strict=True):
            if future.exception() is None:
                stack.push(manager.__exit__)
        yield [future.result() for future in started]


@contextmanager
def app_on_socket(app: Litestar, *, ready_within_s: float = 30) -> Iterator[str]:
    """`app` served by uvicorn in a thread on a free port, once `/ready` answers 200: its base
    URL. For tests whose app runs on fakes, which no `ragrank serve` process can load."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"

    def stopped() -> str | None:
        return None if thread.is_alive() else "the server thread ended before it was ready"

    try:
        wait_until_ready(base + "/ready", ready_within_s, failed=stopped)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=30)


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
