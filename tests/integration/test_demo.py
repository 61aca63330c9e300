from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from litestar.testing import TestClient

from cli import main
from ragrank import SAMPLE_DATASET
from ragrank.store import open_store

if TYPE_CHECKING:
    from litestar import Litestar

    from ragrank.settings import Settings


def _demo_argv(settings: Settings, *extra: str) -> list[str]:
    return [
        "demo",
        "--embed-model",
        settings.embed_model,
        "--rerank-model",
        settings.rerank_model,
        "--device",
        "cpu",
        "--qdrant-path",
        str(settings.qdrant_path),
        "--port",
        "8123",
        *extra,
    ]


def test_demo_indexes_the_sample_shows_both_orders_and_serves_its_labels(
    settings: Settings, capsys, monkeypatch
):
    import server.app

    monkeypatch.setenv("COLUMNS", "200")
    served: list[Settings] = []
    monkeypatch.setattr(server.app, "serve", lambda app, settings: served.append(settings))
    assert main(_demo_argv(settings)) == 0
    out = capsys.readouterr().out
    assert "124 documents: 124 new" in out
    assert out.count("hybrid order") == 3 and out.count("reranked order") == 3
    assert "Qui a inventé l'imprimerie" in out
    assert re.search(r"✓ ", out), "labelled relevant documents are marked"
    assert "curl -s http://127.0.0.1:8123/v1/search" in out
    assert "Playground: http://127.0.0.1:8123/playground" in out
    # The playground marks the sample's labelled answers.
    assert [s.labels for s in served] == [SAMPLE_DATASET]
    store = open_store(settings.replace(collection="ragrank-demo"))
    try:
        assert store.count() >= 124
    finally:
        store.close()


def test_a_document_posted_to_the_demo_becomes_searchable(settings: Settings, monkeypatch):
    """The README's own call against `ragrank demo`: the job runs, on the demo's own worker."""
    import server.app

    def serve(app: Litestar, _settings: Settings) -> None:
        with TestClient(app=app) as client:
            document = {"id": "rhine", "text": "The Rhine flows into the North Sea."}
            job = client.post("/v1/documents", json={"documents": [document]})
            assert job.status_code == 202, job.text
            for _ in range(240):
                status = client.get(f"/v1/jobs/{job.json()['job_id']}").json()
                if status["state"] in ("done", "failed"):
                    break
                time.sleep(0.25)
            assert status["state"] == "done", status
            hits = client.post(
                "/v1/search", json={"query": "Rhine North Sea", "top_k": 100, "rerank": False}
            ).json()["results"]
            answers.append([hit["doc_id"] for hit in hits])

    answers: list[list[str]] = []
    monkeypatch.setattr(server.app, "serve", serve)
    monkeypatch.setenv("RAGRANK_JOBS_PATH", str(settings.jobs_path))
    assert main(_demo_argv(settings)) == 0
    assert len(answers) == 1 and "rhine" in answers[0]
