"""The OpenVINO backends: outputs against torch's for both roles and the reranker families,
the conversion cache, the agreement gate, the stamp, what `auto` picks, and the errors that
name the setting."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np
import pytest

import ragrank.backends.reranker
from eval.random_models import save_spread_reranker, save_tiny_family
from indexing import Indexer
from ragrank import model_files
from ragrank.backends.agreement import Agreement
from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.backends.openvino import (
    RECIPES,
    cache_key,
    files_digest,
    require_runtime,
    resolve_backend,
)
from ragrank.documents import Document
from ragrank.errors import ModelLoadError
from ragrank.roles import EMBEDDING, RERANK
from ragrank.settings import PRESET_CPU_BACKENDS, Settings
from ragrank.store import open_store

pytest.importorskip("openvino")
pytest.importorskip("nncf")

if TYPE_CHECKING:
    from pathlib import Path

#: Texts of many lengths, so that batches are padded and lengths differ between batches.
TEXTS = [f"passage {i}: " + "ein Wort, a word, 一个词 " * (i % 9 + 1) for i in range(40)]
PAIRS = [("which word?", text) for text in TEXTS]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("openvino")


def loaded(kind, path: Path, backend: str, cache: Path, **settings: object):
    """`kind` (the embedder or the scorer class) on `backend`, by its own settings."""
    role = "embed" if kind is SentenceTransformerEmbedder else "rerank"
    chosen = {f"{role}_model": str(path), f"{role}_backend": backend}
    return kind.from_settings(
        Settings(device="cpu", openvino_cache=cache, **chosen, **settings)  # type: ignore[arg-type]
    )


def embedder_on(path: Path, backend: str, cache: Path, **settings: object):
    return loaded(SentenceTransformerEmbedder, path, backend, cache, **settings)


def scorer_on(path: Path, backend: str, cache: Path, **settings: object) -> CrossEncoderScorer:
    return loaded(CrossEncoderScorer, path, backend, cache, **settings)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def openvino_embedder(tiny_embedder_path: Path, cache: Path) -> SentenceTransformerEmbedder:
    return embedder_on(tiny_embedder_path, "openvino", cache)


def test_openvino_vectors_are_the_torch_vectors(
    embedder: SentenceTransformerEmbedder, openvino_embedder: SentenceTransformerEmbedder
):
    for size in (1, 3, len(TEXTS)):
        reference = embedder.embed_passages(TEXTS[:size])
        vectors = openvino_embedder.embed_passages(TEXTS[:size])
        assert vectors.dtype == np.float32 and vectors.shape == reference.shape
        np.testing.assert_allclose(vectors, reference, atol=2e-5)
    assert openvino_embedder.backend == RECIPES["openvino"] != embedder.backend
    agreement = openvino_embedder.agreement
    assert agreement is not None and agreement.texts == 32 and agreement.mean_cosine > 0.9999
    assert not openvino_embedder.packed


def test_a_second_load_reads_the_conversion_from_the_cache(
    tiny_embedder_path: Path, cache: Path, openvino_embedder: SentenceTransformerEmbedder
):
    first = openvino_embedder.conversion
    assert first is not None and (first.path / "model.xml").exists()
    again = embedder_on(tiny_embedder_path, "openvino", cache)
    assert again.conversion is not None and again.conversion.cached
    assert again.conversion.path == first.path
    np.testing.assert_allclose(
        again.embed_queries(TEXTS[:5]), openvino_embedder.embed_queries(TEXTS[:5]), atol=1e-6
    )


def test_the_cache_key_follows_the_files_the_recipe_and_the_versions(
    monkeypatch: pytest.MonkeyPatch,
):
    base = {"weights": "w", "inputs": ["input_ids"], "graph": "g"}
    key = cache_key(backend="openvino", **base)  # type: ignore[arg-type]
    assert key == cache_key(backend="openvino", **base)  # type: ignore[arg-type]
    assert key != cache_key(backend="openvino-int8", **base)  # type: ignore[arg-type]
    assert key != cache_key(backend="openvino", **(base | {"weights": "v"}))  # type: ignore[arg-type]
    monkeypatch.setattr(ragrank.backends.openvino, "_version", lambda name: "0.0")
    assert key != cache_key(backend="openvino", **base)  # type: ignore[arg-type]


def test_the_files_digest_follows_every_file_of_the_model(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "weights.bin").write_bytes(b"\x00" * 8)
    first = files_digest(tmp_path)
    assert files_digest(tmp_path) == first
    (tmp_path / "sub" / "weights.bin").write_bytes(b"\x00" * 7 + b"\x01")
    edited = files_digest(tmp_path)
    (tmp_path / "sub" / "weights.bin").rename(tmp_path / "sub" / "other.bin")
    assert len({first, edited, files_digest(tmp_path)}) == 3


def test_the_int8_embedder_is_quantised_and_gated(tiny_embedder_path: Path, cache: Path):
    int8 = embedder_on(tiny_embedder_path, "openvino-int8", cache, embed_min_agreement=0.0)
    conversion = int8.conversion
    assert conversion is not None and conversion.quantize_s > 0
    assert int8.backend == RECIPES["openvino-int8"]
    vectors = int8.embed_passages(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


def test_switching_the_backend_re_embeds_every_document(
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    openvino_embedder: SentenceTransformerEmbedder,
):
    documents = [Document(doc_id=f"d{i}", text=f"Document {i} says something.") for i in range(3)]
    store = open_store(settings)
    try:
        torch_indexer = Indexer.from_settings(settings, embedder, store)
        openvino_indexer = Indexer.from_settings(settings, openvino_embedder, store)
        assert torch_indexer.content_hash(documents[0]) != openvino_indexer.content_hash(
            documents[0]
        )
        assert torch_indexer.index(documents, progress=False).new == 3
        assert openvino_indexer.index(documents, progress=False).updated == 3
        assert openvino_indexer.index(documents, progress=False).unchanged == 3
        assert torch_indexer.index(documents, progress=False).updated == 3
    finally:
        store.close()


def test_the_torch_stamp_is_the_one_earlier_releases_wrote(
    settings: Settings, embedder: SentenceTransformerEmbedder
):
    """Naming the backend in the recipe must not re-index collections indexed before it."""
    import hashlib
    import json

    store = open_store(settings)
    try:
        indexer = Indexer.from_settings(settings, embedder, store)
    finally:
        store.close()
    document = Document(doc_id="d", text="text", title="title")
    recipe = json.dumps(
        [
            embedder.model_id,
            embedder.passage_prefix,
            indexer.chunker.max_tokens,
            indexer.chunker.overlap,
        ]
    )
    earlier = json.dumps([recipe, "title", "text", {}], sort_keys=True, ensure_ascii=False)
    assert indexer.content_hash(document) == hashlib.sha256(earlier.encode()).hexdigest()


def test_an_embedder_below_the_floor_is_refused(
    tiny_embedder_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
):
    with pytest.raises(ModelLoadError) as error:
        embedder_on(tiny_embedder_path, "openvino-int8", cache, embed_min_agreement=1.0)
    message = str(error.value)
    assert "openvino-int8 embedding model" in message
    assert "RAGRANK_EMBED_MIN_AGREEMENT is 1" in message
    assert "RAGRANK_EMBED_BACKEND=torch" in message


@pytest.mark.parametrize("family", ["modernbert", "qwen3-reranker"])
def test_each_reranker_family_scores_as_torch_does(
    family: str, tmp_path_factory: pytest.TempPathFactory, cache: Path
):
    """Padded batches included: a ModernBERT padding row that sees no key in a local layer
    must not turn the real rows to NaN."""
    path = save_tiny_family(family, tmp_path_factory.mktemp("family") / family)  # type: ignore[arg-type]
    torch_scorer, openvino = scorer_on(path, "torch", cache), scorer_on(path, "openvino", cache)
    reference, scores = torch_scorer.score_pairs(PAIRS), openvino.score_pairs(PAIRS)
    assert np.isfinite(scores).all()
    np.testing.assert_allclose(scores, reference, atol=1e-4)
    assert openvino.agreement is not None and openvino.agreement.mean_spearman > 0.99


def test_the_xlmr_reranker_scores_as_torch_does(
    scorer: CrossEncoderScorer, tiny_reranker_path: Path, cache: Path
):
    openvino = scorer_on(tiny_reranker_path, "openvino", cache)
    np.testing.assert_allclose(
        openvino.score("which word?", TEXTS), scorer.score("which word?", TEXTS), atol=1e-5
    )
    assert openvino.backend == RECIPES["openvino"] and not openvino.packed


def test_int8_keeps_the_ranking_of_a_reranker_whose_logits_spread(
    tmp_path_factory: pytest.TempPathFactory, cache: Path
):
    """A random head barely spreads its logits; this one spreads them, so the ranking the
    gate measures is one quantisation could change."""
    path = save_spread_reranker(tmp_path_factory.mktemp("spread") / "spread")
    int8 = scorer_on(path, "openvino-int8", cache)
    assert int8.backend == RECIPES["openvino-int8"]
    assert int8.conversion is not None and int8.conversion.quantize_s > 0
    assert isinstance(int8.agreement, Agreement) and int8.agreement.mean_spearman >= 0.9
    assert np.isfinite(int8.score_pairs(PAIRS)).all()


def test_a_reranker_below_the_floor_is_refused(
    tiny_reranker_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
):
    poor = Agreement(queries=8, pairs=96, mean_spearman=0.5, min_spearman=0.1, top1=0.5,
                     max_abs_diff=0.3)  # fmt: skip
    monkeypatch.setattr(ragrank.backends.reranker, "rank_agreement", lambda *_: poor)
    with pytest.raises(ModelLoadError) as error:
        scorer_on(tiny_reranker_path, "openvino", cache)
    message = str(error.value)
    assert "RAGRANK_RERANK_MIN_AGREEMENT is 0.9" in message and "0.500" in message


def test_without_openvino_the_error_names_the_setting_and_the_extra(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(ModelLoadError) as error:
        require_runtime(RERANK, "openvino", "cpu")
    message = str(error.value)
    assert "RAGRANK_RERANK_BACKEND=openvino needs OpenVINO" in message
    assert "ragrank[openvino]" in message and "RAGRANK_RERANK_BACKEND=torch" in message


def test_without_nncf_int8_names_the_float_backend(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "nncf", None)
    require_runtime(EMBEDDING, "openvino", "cpu")  # float32 needs no NNCF
    with pytest.raises(ModelLoadError, match=r"RAGRANK_EMBED_BACKEND=openvino$"):
        require_runtime(EMBEDDING, "openvino-int8", "cpu")


def test_openvino_is_cpu_only():
    with pytest.raises(ModelLoadError) as error:
        require_runtime(EMBEDDING, "openvino-int8", "cuda:0")
    assert "RAGRANK_EMBED_BACKEND=openvino-int8 runs on the CPU only" in str(error.value)
    assert "RAGRANK_EMBED_BACKEND=torch on cuda:0" in str(error.value)


def test_auto_picks_the_presets_cpu_backends_and_torch_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
):
    embed, rerank = PRESET_CPU_BACKENDS["small"]
    assert resolve_backend("auto", role=EMBEDDING, preset="small", device="cpu") == embed
    assert resolve_backend("auto", role=RERANK, preset="small", device="cpu") == rerank
    assert resolve_backend("auto", role=EMBEDDING, preset="small", device="cuda") == "torch"
    assert resolve_backend("auto", role=EMBEDDING, preset="default", device="cpu") == "torch"
    assert resolve_backend("auto", role=EMBEDDING, preset=None, device="cpu") == "torch"
    assert resolve_backend("torch", role=EMBEDDING, preset="small", device="cpu") == "torch"
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert resolve_backend("auto", role=EMBEDDING, preset="small", device="cpu") == "torch"


def test_the_small_preset_runs_its_cpu_backends_here(
    tiny_embedder_path: Path, tiny_reranker_path: Path, cache: Path
):
    """What `auto` picks on a CPU for the `small` preset loads and runs in this environment,
    which `make setup` built with the extras the CPU image installs."""
    settings = Settings(
        preset="small",
        embed_model=str(tiny_embedder_path),
        rerank_model=str(tiny_reranker_path),
        device="cpu",
        openvino_cache=cache,
        embed_min_agreement=0.0,
        rerank_min_agreement=-1.0,
    )
    assert (settings.embed_backend, settings.rerank_backend) == ("auto", "auto")
    embedder = SentenceTransformerEmbedder.from_settings(settings)
    scorer = CrossEncoderScorer.from_settings(settings)
    embed, rerank = PRESET_CPU_BACKENDS["small"]
    assert (embedder.backend, scorer.backend) == (RECIPES[embed], RECIPES[rerank])
    assert embedder.embed_queries(TEXTS[:3]).shape == (3, embedder.dimension)
    assert np.isfinite(scorer.score("which word?", TEXTS[:3])).all()


def test_models_check_converts_ahead_and_says_how(
    tiny_embedder_path: Path, tiny_reranker_path: Path, cache: Path
):
    """`ragrank models check` loads each model as the server does, so it is how a machine
    converts before its first request; it says which backend and how the model was made."""
    settings = Settings(
        embed_model=str(tiny_embedder_path),
        rerank_model=str(tiny_reranker_path),
        device="cpu",
        embed_backend="openvino",
        rerank_backend="openvino",
        openvino_cache=cache,
    )
    statuses = model_files.check(settings)
    assert [s.loads for s in statuses] == [True, True]
    for status in statuses:
        assert status.backend.startswith(RECIPES["openvino"])
        assert "compiled in" in status.backend
