"""`ragrank serve` as a user runs it: a real process, real HTTP on loopback."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx

from tests.servers import ragrank_serve

if TYPE_CHECKING:
    from ragrank.settings import Settings


def test_serve_answers_over_http_and_stops_cleanly(settings: Settings):
    flags = [
        "--embed-model",
        settings.embed_model,
        "--rerank-model",
        settings.rerank_model,
        "--qdrant-path",
        str(settings.qdrant_path),
        "--device",
        "cpu",
    ]
    env = {"RAGRANK_JOBS_PATH": str(settings.jobs_path)}
    with ragrank_serve(flags, env) as (base, server):
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
    assert server.returncode == 0
