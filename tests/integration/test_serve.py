"""`ragrank serve` as a user runs it: a real process, real HTTP on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from ragrank.settings import Settings


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_answers_over_http_and_stops_cleanly(settings: Settings):
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "ragrank.cli",
        "serve",
        "--port",
        str(port),
        "--embed-model",
        settings.embed_model,
        "--rerank-model",
        settings.rerank_model,
        "--qdrant-path",
        str(settings.qdrant_path),
        "--device",
        "cpu",
    ]
    server = subprocess.Popen(
        command,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "RAGRANK_JOBS_PATH": str(settings.jobs_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server not ready within 120 s"
            time.sleep(0.5)
        # A fresh collection exists and is empty: a search succeeds with no results.
        response = httpx.post(f"{base}/v1/search", json={"query": "anything"}, timeout=30)
        assert response.status_code == 200
        assert response.json()["results"] == []
        bad = httpx.post(f"{base}/v1/search", json={"query": "x", "top_k": 0}, timeout=30)
        assert bad.status_code == 400
        assert bad.json()["error"]["field"] == "top_k"
        # On an embedded Qdrant folder the server runs the indexing worker itself.
        document = {"id": "d1", "text": "The Rhine flows into the North Sea."}
        job = httpx.post(f"{base}/v1/documents", json={"documents": [document]}, timeout=30)
        assert job.status_code == 202
        for _ in range(240):
            status = httpx.get(f"{base}/v1/jobs/{job.json()['job_id']}", timeout=30).json()
            if status["state"] == "done":
                break
            time.sleep(0.25)
        assert status["state"] == "done" and status["counts"]["new"] == 1, status
        hits = httpx.post(f"{base}/v1/search", json={"query": "Rhine"}, timeout=30).json()
        assert [hit["doc_id"] for hit in hits["results"]] == ["d1"]
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert server.returncode == 0
