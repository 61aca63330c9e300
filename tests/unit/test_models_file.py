"""Typed per-model configuration: each served model's spec from the one-model variables, the
model lists, or a models file; a typo stops start-up naming the file, the model and the
choices; a file that contradicts the environment is refused."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from litestar.testing import AsyncTestClient

from ragrank.errors import SettingsError
from ragrank.inference import Inference, Served, model_specs, role_spec
from ragrank.roles import EMBEDDING, RERANK
from ragrank.settings import Settings
from server import create_app
from tests.fakes import FakeEmbedder, FakeScorer, ShortFirstScorer, swap_models

if TYPE_CHECKING:
    from server import Services

TWO_RERANKERS = """
[[models]]
name = "e5"
role = "embedding"
model = "intfloat/multilingual-e5-base"

[[models]]
name = ["bge", "rerank-v3.5"]
role = "rerank"
model = "BAAI/bge-reranker-v2-m3"
device = "cuda"
dtype = "bfloat16"
max_batch_tokens = 32768

[[models]]
name = "minilm"
role = "rerank"
model = "cross-encoder/ms-marco-MiniLM-L-6-v2"
backend = "openvino-int8"
device = "cpu"
max_batch_size = 32
"""


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_environment_alone_gives_one_spec_a_role_with_its_variables():
    settings = Settings(rerank_backend="torch", rerank_batch_tokens=4096, embed_batch_size=8)
    specs = model_specs(settings)
    (embedder,), (reranker,) = specs.embedders, specs.rerankers
    assert embedder.model == settings.embed_model and embedder.max_batch_size == 8
    assert embedder.query_prefix == "query: "  # an e5 model's own prefixes
    assert reranker.backend == "torch" and reranker.max_batch_tokens == 4096


def test_a_models_file_configures_each_model_on_its_own(tmp_path: Path):
    settings = Settings(models_file=_file(tmp_path, TWO_RERANKERS), rerank_batch_size=4)
    specs = model_specs(settings)
    assert [s.name for s in specs.embedders] == ["e5"]
    bge, minilm = specs.rerankers
    assert bge.names == ("bge", "rerank-v3.5", "BAAI/bge-reranker-v2-m3")
    assert (bge.device, bge.dtype, bge.max_batch_tokens) == ("cuda", "bfloat16", 32768)
    assert (minilm.backend, minilm.device, minilm.max_batch_size) == ("openvino-int8", "cpu", 32)
    # What a table leaves out comes from its role's variables.
    assert bge.max_batch_size == 4 and bge.backend == settings.rerank_backend
    assert specs.embedders[0].passage_prefix == "passage: "


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('name = "x"\nrole = "rerank"\nmodel = "m"\nbakend = "torch"', "unknown key 'bakend'"),
        ('name = "x"\nrole = "rerank"\nmodel = "m"\nbackend = "tensorrt"', "one of auto, torch"),
        ('name = "x"\nrole = "reranker"\nmodel = "m"', "one of embedding, rerank"),
        ('name = "x"\nrole = "rerank"\nmodel = "m"\ndtype = "fp8"', "one of auto, float32"),
        ('name = "x"\nrole = "rerank"\nmodel = "m"\nmax_batch_size = -1', ">= 0"),
        ('name = "x"\nrole = "rerank"', "missing model"),
        ('name = "x"\nrole = "rerank"\nmodel = "m"\nquery_prefix = "q: "', "prefixes are for"),
        ('name = "x"\nrole = "rerank"\nmodel = "m"\ndevice = "tpu"', "cpu, cuda, cuda:N"),
    ],
)
def test_a_typo_stops_start_up_naming_the_file_the_model_and_the_choices(
    tmp_path: Path, table: str, says: str
):
    path = _file(tmp_path, f"[[models]]\n{table}\n")
    with pytest.raises(SettingsError) as error:
        model_specs(Settings(models_file=path))
    message = str(error.value)
    assert "RAGRANK_MODELS_FILE" in message and str(path) in message and "model #1" in message
    assert says in message


def test_a_file_that_is_missing_or_not_toml_or_names_a_model_twice_is_refused(tmp_path: Path):
    with pytest.raises(SettingsError, match="no file at"):
        model_specs(Settings(models_file=tmp_path / "absent.toml"))
    with pytest.raises(SettingsError, match="not a readable TOML file"):
        model_specs(Settings(models_file=_file(tmp_path, "[[models]\n")))
    twice = '[[models]]\nname = "a"\nrole = "rerank"\nmodel = "m"\n' * 2
    with pytest.raises(SettingsError, match="given to two rerank models"):
        model_specs(Settings(models_file=_file(tmp_path, twice)))


def test_a_file_contradicting_the_environments_model_list_is_refused(tmp_path: Path):
    path = _file(tmp_path, TWO_RERANKERS)
    with pytest.raises(SettingsError, match="RAGRANK_RERANK_MODELS"):
        model_specs(Settings(models_file=path, rerank_models="other=some/model"))
    with pytest.raises(SettingsError, match="RAGRANK_EMBED_MODEL="):
        model_specs(Settings(models_file=path, embed_model="another/embedder"))
    # The same list in both places is no contradiction; a role the file leaves out is the
    # environment's.
    same = "bge|rerank-v3.5=BAAI/bge-reranker-v2-m3,minilm=cross-encoder/ms-marco-MiniLM-L-6-v2"
    assert len(model_specs(Settings(models_file=path, rerank_models=same)).rerankers) == 2
    only = _file(tmp_path, '[[models]]\nname = "r"\nrole = "rerank"\nmodel = "m"\n')
    specs = model_specs(Settings(models_file=only, embed_model="my/embedder"))
    assert [s.model for s in specs.embedders] == ["my/embedder"]


async def test_v1_models_shows_each_models_backend_dtype_and_device(indexed_services: Services):
    settings = Settings(device="cpu")
    second = Served(role_spec(settings, RERANK, "short", ("short",)), ShortFirstScorer())
    services = swap_models(indexed_services, settings, rerankers=[FakeScorer(), second])
    async with AsyncTestClient(app=create_app(settings, services=services)) as client:
        cards = (await client.get("/v1/models")).json()["data"]
    assert [(c["type"], c["device"], c["dtype"]) for c in cards] == [
        ("embedding", "cpu", "float32"),
        ("rerank", "cpu", "float32"),
        ("rerank", "cpu", "float32"),
    ]
    assert all(card["backend"] == "torch" for card in cards)


def test_the_indexers_embedder_runs_through_the_engine_as_bulk_work():
    """Vectors the indexer asks for are batches of the embedder's engine, marked bulk, so that
    requests go first and the metrics see them."""
    embedder = FakeEmbedder()
    inference = Inference.of(Settings(embed_batch_size=2), embedders=[embedder])
    seen = []
    inference.on_batch.append(seen.append)
    with inference.running():
        vectors = inference.bulk_embedder().embed_passages(["one", "two words", "three more words"])
    assert vectors.shape == (3, FakeEmbedder.dimension)
    expected = embedder.embed_passages(["one", "two words", "three more words"])
    assert (vectors == expected).all()
    assert seen and all(stats.bulk and stats.engine == EMBEDDING.engine for stats in seen)
    assert max(stats.items for stats in seen) <= 2


def test_the_docs_example_models_file_is_read_as_it_says(tmp_path: Path):
    text = (Path(__file__).parents[2] / "docs" / "models.md").read_text(encoding="utf-8")
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    specs = model_specs(Settings(models_file=_file(tmp_path, example)))
    bge, minilm = specs.rerankers
    assert (bge.device, bge.dtype, bge.names[:2]) == ("cuda", "bfloat16", ("bge", "rerank-v3.5"))
    assert (minilm.backend, minilm.device) == ("openvino-int8", "cpu")
    assert specs.embedders[0].device == "cuda"
