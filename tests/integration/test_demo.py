from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ragrank import SAMPLE_DATASET
from ragrank.cli import main
from ragrank.store import open_store

if TYPE_CHECKING:
    from ragrank.settings import Settings


def test_demo_indexes_the_sample_shows_both_orders_and_serves_its_labels(
    settings: Settings, capsys, monkeypatch
):
    import server.demo

    monkeypatch.setenv("COLUMNS", "200")
    served: list[Settings] = []
    monkeypatch.setattr(server.demo, "serve_app", lambda app, settings: served.append(settings))
    argv = [
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
    ]
    assert main(argv) == 0
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
