"""`ragrank eval`'s front door: load the models named by the settings, evaluate each dataset,
print the table and write the report."""

from __future__ import annotations

import logging
import re
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval.against import against, read_report
from eval.embedding_cache import model_fingerprint
from eval.exact import faiss_build
from eval.report import build_report, print_table, write_report
from eval.suite import StoreFactory, evaluate_datasets
from eval.systems import TOP_K, plan
from ragrank.backends.serving import load_inference
from ragrank.device import resolve_placement
from ragrank.errors import DocumentError
from ragrank.inference import ModelSpec, ModelSpecs, model_specs, role_spec
from ragrank.roles import EMBEDDING, RERANK
from ragrank.sparse import sparse_encoder
from ragrank.store import EdgeStore, IndexTuning, Store, open_store, sparse_stamp

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from eval.options import EvalOptions
    from ragrank.settings import Settings


log = logging.getLogger(__name__)


def default_output(now: datetime | None = None) -> Path:
    return Path("eval-results") / (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")


def run_eval(
    settings: Settings,
    datasets: Sequence[Path],
    options: EvalOptions,
    output: Path,
    *,
    baseline_embed_model: str | None = None,
    merge: Sequence[Path] = (),
    against_report: Path | None = None,
) -> int:
    """Evaluate each dataset with the configured models, then the `merge` folders as one
    collection; `baseline_embed_model` adds that embedder's cosine run as the baseline of the
    configured embedder (with its own default prefixes); `against_report` compares every
    system with the same one in that earlier report."""
    for path in datasets:
        if not path.is_dir():
            raise DocumentError(f"--dataset {path}: not a folder")
    earlier = read_report(against_report) if against_report else None
    options = replace(options, cascade=settings.cascade, rerank_blend=settings.rerank_blend)
    merge = beir_folders(merge)
    faiss_build()  # two faiss builds installed are refused before any model loads
    reranks = any(system.needs_reranker for system in plan(options.systems))
    sparse = sparse_encoder(settings)
    # The reranker batches as the eval's options say; the baseline embedder reads its own
    # model's default prefixes.
    rerank_settings = replace(
        settings,
        rerank_batch_size=options.rerank_batch_size,
        rerank_batch_tokens=options.rerank_batch_tokens,
    )
    embedders = [role_spec(settings, EMBEDDING, settings.embed_model)]
    if baseline_embed_model:
        unprefixed = replace(
            settings, embed_model=baseline_embed_model, query_prefix=None, passage_prefix=None
        )
        embedders.append(role_spec(unprefixed, EMBEDDING, baseline_embed_model))
    rerankers = _rerankers(rerank_settings, options) if reranks else []
    inference = load_inference(
        settings, ModelSpecs(tuple(embedders), tuple(rerankers)), offline=True
    )
    with inference.running():
        embedder = inference.bulk_embedder()
        baseline = inference.bulk_embedder(baseline_embed_model) if baseline_embed_model else None
        results = list(
            evaluate_datasets(
                datasets,
                embedder,
                inference if reranks else None,
                options,
                store_factory(settings, sparse_stamp(sparse)),
                baseline_embedder=baseline,
                sparse=sparse,
                merge=merge,
            )
        )
    config = _config(settings, (*datasets, *merge), options, reranks)
    config["embed_backend"] = embedder.backend
    embedder_model = inference.embedder
    agreement = getattr(embedder_model, "agreement", None)
    if agreement is not None:
        config["embed_agreement"] = asdict(agreement)
    conversion = getattr(embedder_model, "conversion", None)
    if conversion is not None:
        config["embed_conversion"] = str(conversion)
    config["sparse"] = {"encoder": settings.sparse, "recipe": sparse.recipe if sparse else None}
    if baseline is not None:
        config |= {
            "baseline_embed_model": baseline.model_id,
            "baseline_embed_model_fingerprint": model_fingerprint(baseline.model_id),
            "baseline_query_prefix": baseline.query_prefix,
            "baseline_passage_prefix": baseline.passage_prefix,
        }
    report = build_report(results, config)
    if earlier is not None:
        report["against"] = against(report, earlier, str(against_report))
    print_table(report)
    for path in write_report(report, results, output):
        print(f"wrote {path}")
    return 0


def _rerankers(settings: Settings, options: EvalOptions) -> list[ModelSpec]:
    """The default reranker, or every served one when a cascade system runs (its fast
    reranker is one of RAGRANK_RERANK_MODELS)."""
    if any(name.startswith("cascade") for name in options.systems):
        return list(model_specs(settings).rerankers)
    return [role_spec(settings, RERANK, settings.rerank_model)]


def beir_folders(paths: Sequence[Path]) -> list[Path]:
    """The BEIR folders among `paths`, so that `--merge data/*` may name a README or a folder
    of raw files beside them; each one left out is logged."""
    folders = []
    for path in paths:
        if path.is_dir() and (path / "queries.jsonl").exists():
            folders.append(path)
        else:
            log.warning("--merge: %s is not a BEIR folder (no queries.jsonl), left out", path)
    if paths and not folders:
        raise DocumentError("--merge: none of the paths is a BEIR folder (with queries.jsonl)")
    return folders


def store_factory(settings: Settings, sparse: str = "") -> StoreFactory:
    """Qdrant search in a throw-away Qdrant Edge shard whose every segment gets an HNSW graph
    (however small the dataset, so that the graph's recall is what is measured), or in a
    collection of the Qdrant server named after the dataset, the embeddings and `sparse`, the
    stamp of the BM25 encoder (reused by later runs)."""

    @contextmanager
    def open_ann_store(dataset: str, key: str) -> Iterator[Store]:
        name = re.sub(r"[^A-Za-z0-9_-]", "_", dataset)
        with tempfile.TemporaryDirectory(prefix="ragrank-eval-") as folder:
            if settings.uses_embedded_qdrant:
                tuning = replace(
                    IndexTuning.from_settings(settings),
                    indexing_threshold_kb=1,
                    full_scan_threshold_kb=1,
                )
                store: Store = EdgeStore(
                    Path(folder), f"eval-{name}", tuning=tuning, sparse=settings.sparse != "none"
                )
            else:
                collection = f"{settings.collection}-eval-{name}-{key[:12]}{sparse[:8]}"
                store = open_store(replace(settings, collection=collection))
            try:
                yield store
            finally:
                store.close()

    return open_ann_store


def _config(
    settings: Settings, datasets: Sequence[Path], options: EvalOptions, reranks: bool
) -> dict[str, Any]:
    placement = resolve_placement(settings.device, settings.dtype)
    query_prefix, passage_prefix = settings.prefixes()
    return {
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
        "systems": [system.name for system in plan(options.systems)],
        "datasets": [str(path) for path in datasets],
        "top_k": TOP_K,
        "embed_model": settings.embed_model,
        "embed_model_fingerprint": model_fingerprint(settings.embed_model),
        "rerank_model": settings.rerank_model if reranks else None,
        "rerank_model_fingerprint": model_fingerprint(settings.rerank_model) if reranks else None,
        "rerank_max_length": settings.rerank_max_length,
        "query_prefix": query_prefix,
        "passage_prefix": passage_prefix,
        "device": placement.device,
        "dtype": str(placement.dtype).removeprefix("torch."),
        "ann_store": "embedded (Qdrant Edge)"
        if settings.uses_embedded_qdrant
        else settings.qdrant_url,
        "hnsw": {
            "m": settings.hnsw_m,
            "ef_construct": settings.hnsw_ef_construct,
            "ef": settings.hnsw_ef,
        },
    }
