"""Several real models in one server, loaded from settings: each served by its own engine
through the routes, and a set that does not fit the device's memory refused at start-up with
the figures. Tiny random models: mechanics only."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch
from litestar.testing import TestClient

from cli.compose import load_services
from eval.random_models import save_tiny_family
from ragrank.backends.models import CrossEncoderScorer
from ragrank.errors import ModelLoadError
from ragrank.memory import weights_bytes
from server import create_app
from tests.conftest import tiny_settings

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(scope="module")
def qwen_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_family("qwen3-reranker", tmp_path_factory.mktemp("served") / "qwen")


def test_weights_are_sized_from_the_files_in_the_dtype_they_run_in(tiny_reranker_path: Path):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_reranker_path))
    elements = sum(t.numel() for t in model.state_dict().values())
    assert weights_bytes(str(tiny_reranker_path), "float32") == elements * 4
    assert weights_bytes(str(tiny_reranker_path), "bfloat16") == elements * 2
    assert weights_bytes("no-such-org/no-such-model", "float32") is None


def test_two_rerankers_load_from_settings_and_each_answers_by_name(
    tmp_path: Path, tiny_embedder_path: Path, tiny_reranker_path: Path, qwen_path: Path
):
    settings = tiny_settings(tmp_path, tiny_embedder_path, tiny_reranker_path).replace(
        rerank_models=f"bge={tiny_reranker_path},qwen={qwen_path}"
    )
    services = load_services(settings)
    try:
        assert [s.name for s in services.inference.rerankers] == ["bge", "qwen"]
        documents = ["The Rhine flows into the North Sea.", "Tea grows in Darjeeling."]
        # Each model scored directly: the routes must hand each name to its own model.
        expected = {
            s.name: s.model.score("rivers", documents) for s in services.inference.rerankers
        }
        assert type(services.inference.rerankers[1].model) is CrossEncoderScorer
        assert services.inference.rerankers[1].model.family.name == "qwen3-reranker"
        assert expected["bge"].tolist() != pytest.approx(expected["qwen"].tolist(), abs=1e-3)
        with TestClient(create_app(settings, services=services)) as client:
            for name, logits in expected.items():
                body = {"query": "rivers", "documents": documents, "raw_scores": True}
                answer = client.post("/v1/rerank", json={**body, "model": name})
                assert answer.status_code == 200, answer.text
                got = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
                assert [got[0], got[1]] == pytest.approx(logits.tolist(), abs=1e-5), name
    finally:
        services.store.close()


def test_a_set_that_does_not_fit_is_refused_at_start_up_with_the_figures(
    tmp_path: Path,
    tiny_embedder_path: Path,
    tiny_reranker_path: Path,
    qwen_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    settings = tiny_settings(tmp_path, tiny_embedder_path, tiny_reranker_path).replace(
        rerank_models=f"bge={tiny_reranker_path},qwen={qwen_path}"
    )
    needed = sum(
        weights_bytes(str(p), "float32") or 0
        for p in (tiny_embedder_path, tiny_reranker_path, qwen_path)
    )
    # Free memory for all of them, but not once the share for the batches is set aside (the
    # test above loads the same set with the machine's real free memory).
    monkeypatch.setattr(
        "ragrank.backends.serving.available_bytes", lambda device: int(needed * 1.1)
    )
    loaded: list[str] = []
    monkeypatch.setattr(torch.nn.Module, "eval", lambda self: loaded.append("x") or self)
    with pytest.raises(ModelLoadError) as refused:
        load_services(settings)
    message = str(refused.value)
    assert "GiB of weights in float32" in message and "RAGRANK_MODEL_MEMORY_SHARE=0.8" in message
    assert "bge" in message and "qwen" in message
    assert not loaded  # refused before any model loaded
