"""The `ragrank` command. Each subcommand builds `Settings` from the environment and its flags,
then hands over to one front door (server, indexing); those are imported lazily so that
`--help` stays fast."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from ragrank import __version__
from ragrank.errors import RagrankError
from ragrank.logs import configure_logging
from ragrank.settings import PRESETS, Settings, env_name

DEMO_COLLECTION = "ragrank-demo"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from eval.bench_load import main as bench

        run: Callable[[], int] = partial(bench, argv[1:])
    else:
        args = build_parser().parse_args(argv)
        command: Callable[[argparse.Namespace], int] = args.run
        run = partial(command, args)
    try:
        settings = Settings.from_env()
        configure_logging(settings.log_format, settings.log_level)
        code: int = run()
    except RagrankError as exc:
        print(f"ragrank: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragrank",
        description="Retrieval from Qdrant with cross-encoder reranking. Every flag has a "
        "RAGRANK_* environment variable (see the README); flags win.",
    )
    parser.add_argument("--version", action="version", version=f"ragrank {__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the REST API (/v1/search, /health, /ready, /schema)",
        description="Load the models, open Qdrant (embedded folder, or a server with "
        "RAGRANK_QDRANT_URL) and serve the REST API.",
    )
    _add_common(serve)
    _add_listen(serve)
    serve.set_defaults(run=_serve)

    index = commands.add_parser(
        "index",
        help="chunk, embed and upsert documents into Qdrant",
        description="Sync a JSONL file ('id' or '_id', 'text', optional 'title' and "
        "'metadata'), a BEIR corpus.jsonl(.gz), or a folder of .txt/.md/.html files into "
        "Qdrant. Unchanged documents are skipped without embedding, changed ones replaced; a "
        "run that was killed is completed by the next one.",
    )
    index.add_argument("path", type=Path, help="a .jsonl/.jsonl.gz file or a folder")
    _add_common(index)
    index.add_argument("--chunk-tokens", type=int, help="tokens per chunk (RAGRANK_CHUNK_TOKENS)")
    index.add_argument("--chunk-overlap", type=int, help="tokens shared by neighbouring chunks")
    index.add_argument(
        "--batch-size", dest="index_batch_size", type=int, help="chunks embedded per batch"
    )
    index.add_argument(
        "--delete-missing",
        action="store_true",
        help="delete documents indexed earlier from this PATH that it no longer holds",
    )
    index.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    index.set_defaults(run=_index)

    worker = commands.add_parser(
        "worker",
        help="run the indexing worker: jobs from the API and watched folders",
        description="Run queued jobs (POST/DELETE /v1/documents) from the SQLite queue at "
        "RAGRANK_JOBS_PATH and keep the RAGRANK_WATCH folders in sync, until interrupted. "
        "With an embedded Qdrant folder, `ragrank serve` already runs the worker itself.",
    )
    _add_common(worker)
    worker.add_argument("--jobs-path", type=Path, help="the job queue (RAGRANK_JOBS_PATH)")
    worker.add_argument("--watch", help="comma-separated folders to sync (RAGRANK_WATCH)")
    worker.set_defaults(run=_worker)

    demo = commands.add_parser(
        "demo",
        help="index the bundled sample corpus, show cosine vs reranked order, then serve",
        description="Index the bundled multilingual sample (124 short documents, 16 labelled "
        f"queries) into the collection '{DEMO_COLLECTION}', print a few queries in cosine and "
        "in reranked order, then serve the API. --preset auto picks 'small' models on a "
        "machine without CUDA.",
    )
    _add_common(demo, preset_default="auto")
    _add_listen(demo)
    demo.add_argument(
        "--no-serve", action="store_true", help="exit after the examples instead of serving"
    )
    demo.set_defaults(run=_demo)

    model_files = commands.add_parser(
        "models",
        help="pull the configured models into the cache, or check that they load",
        description="pull: download the configured embedding and reranking models into the "
        "Hugging Face cache (HF_HOME), so the stack can start offline. check: load each "
        "through the server's own code and report where from, its dimension and max length; "
        "exits 1 if any fails.",
    )
    model_files.add_argument("action", choices=("pull", "check"))
    _add_common(model_files)
    model_files.set_defaults(run=_models)

    _add_store(commands)

    _add_eval(commands)

    finetune = commands.add_parser(
        "finetune",
        help="fine-tune the reranker or the embedder on a BEIR collection's relevance labels",
        description="Domain adaptation: train on qrels/<split>.tsv with hard negatives mined "
        "from the configured embedder's cosine top-k, validate on held-out train queries, keep "
        "the best checkpoint by validation NDCG@10 and save a model folder for "
        "RAGRANK_RERANK_MODEL or RAGRANK_EMBED_MODEL. Queries of --held-out-split are never "
        "seen. Rerun the same command to resume an interrupted run.",
    )
    roles = finetune.add_subparsers(title="models", required=True, metavar="MODEL")
    for role, defaults in FINETUNE_DEFAULTS.items():
        _add_finetune(roles, role, defaults)

    # Listed for --help only: `main` hands `bench ...` to eval.bench_load's own parser, so
    # that its heavy imports stay out of the other commands.
    commands.add_parser(
        "bench",
        help="load-test /v1/rerank against the model-only ceiling, other batching and "
        "Infinity (ragrank bench --help)",
    )
    return parser


#: Per-model defaults of `ragrank finetune`: (help, loss choices, batch size, negatives).
FINETUNE_DEFAULTS: dict[str, tuple[str, tuple[str, ...], int, int]] = {
    "reranker": (
        "train a one-logit cross-encoder (binary cross-entropy or ListNet); --base may be a "
        "cross-encoder or a plain encoder, which gets a fresh head",
        ("bce", "listnet"),
        16,
        4,
    ),
    "embedder": (
        "train the bi-encoder with multiple negatives ranking (in-batch negatives plus the "
        "mined ones), keeping the query/passage prefixes",
        ("mnrl",),
        32,
        1,
    ),
}


def _add_finetune(
    roles: argparse._SubParsersAction[argparse.ArgumentParser],
    role: str,
    defaults: tuple[str, tuple[str, ...], int, int],
) -> None:
    description, losses, batch_size, negatives = defaults
    setting = "RAGRANK_RERANK_MODEL" if role == "reranker" else "RAGRANK_EMBED_MODEL"
    parser = roles.add_parser(role, help=description, description=description + ".")
    parser.add_argument("--dataset", required=True, type=Path, metavar="DIR", help="BEIR folder")
    parser.add_argument(
        "--output",
        required=True,
        type=Path,
        help="run folder: checkpoints, report and the model in model/ (rerun to resume)",
    )
    parser.add_argument("--split", default="train", help="qrels/<split>.tsv to train on (train)")
    parser.add_argument(
        "--held-out-split",
        default="test",
        help="split whose queries are never trained or validated on ('none': no such split)",
    )
    parser.add_argument("--base", help=f"model to start from (default: {setting})")
    parser.add_argument("--epochs", type=float, default=3.0, help="training epochs (3)")
    parser.add_argument("--learning-rate", type=float, default=3e-5, help="peak rate (3e-5)")
    parser.add_argument("--warmup-ratio", type=float, default=0.06, help="warm-up share (0.06)")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW decay (0.01)")
    parser.add_argument(
        "--batch-size", type=int, default=batch_size, help=f"examples per step ({batch_size})"
    )
    parser.add_argument(
        "--loss", choices=losses, default=losses[0], help=f"training loss ({losses[0]})"
    )
    parser.add_argument(
        "--negatives",
        type=int,
        default=negatives,
        help=f"hard negatives per {'query' if role == 'reranker' else 'example'} ({negatives})",
    )
    parser.add_argument(
        "--mine-depth", type=int, default=30, help="cosine top-k negatives are drawn from (30)"
    )
    parser.add_argument(
        "--near-duplicate",
        type=float,
        default=0.95,
        help="skip candidates this cosine-similar to a positive (0.95)",
    )
    parser.add_argument(
        "--validation-fraction",
        type=float,
        default=0.1,
        help="share of the training queries held out for validation (0.1)",
    )
    parser.add_argument(
        "--validation-candidates",
        type=int,
        default=20,
        help="cosine candidates per validation query (20)",
    )
    parser.add_argument(
        "--max-length", type=int, default=256, help="token limit while training (256)"
    )
    parser.add_argument("--seed", type=int, default=42, help="split, mining and training (42)")
    parser.add_argument("--max-steps", type=int, help="stop after N steps (smoke runs)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path("ragrank-data/eval-cache"),
        help="corpus embedding cache, shared with ragrank eval",
    )
    parser.add_argument("--no-cache", action="store_true", help="always embed the corpus")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_common(parser)
    parser.set_defaults(run=_finetune, role=role)


def _add_eval(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="NDCG@10 of cosine, BM25, hybrid and reranked retrieval on BEIR datasets",
        description="Evaluate on BEIR-format collections (corpus.jsonl(.gz), queries.jsonl, "
        "qrels/<split>.tsv): exact cosine top-100 with faiss, Qdrant's own dense (ANN), BM25 "
        "and hybrid search, and the cross-encoder over a first stage's top --candidates. "
        "Prints NDCG@10 per dataset with paired significance tests against cosine, bootstrap "
        "CIs, per-query wins/ties/losses and each system's oracle@K (the best any reranker "
        "could do with its top K); writes report.json, report.md and plots to --output.",
    )
    evaluate.add_argument(
        "--dataset",
        dest="datasets",
        action="append",
        required=True,
        type=Path,
        metavar="DIR",
        help="a BEIR-format folder; repeat for several (one row each, plus a macro average)",
    )
    evaluate.add_argument("--split", default="test", help="qrels/<split>.tsv to use (test)")
    evaluate.add_argument(
        "--systems",
        default="cosine,reranked,ann,bm25,hybrid",
        help="comma-separated runs: cosine (always run: the baseline), reranked (cosine's "
        "top reranked), ann, bm25, hybrid, hybrid-reranked (hybrid's top reranked); default: "
        "all but hybrid-reranked",
    )
    evaluate.add_argument(
        "--candidates", type=int, default=100, help="first-stage documents reranked (100)"
    )
    evaluate.add_argument(
        "--fusion",
        choices=("rrf", "dbsf"),
        help="how hybrid fuses dense and BM25 (default: RAGRANK_FUSION)",
    )
    evaluate.add_argument("--rrf-k", type=int, help="RRF's k (default: RAGRANK_RRF_K)")
    for role in ("dense", "sparse"):
        evaluate.add_argument(
            f"--rrf-{role}-weight",
            type=float,
            help=f"RRF's weight of the {role} list (default: RAGRANK_RRF_{role.upper()}_WEIGHT)",
        )
    evaluate.add_argument(
        "--oracle-k",
        type=int,
        help="depth K of oracle@K, the best reordering of each system's top K "
        "(default: --candidates)",
    )
    evaluate.add_argument(
        "--limit-queries", type=int, help="evaluate the first N judged queries of each dataset"
    )
    evaluate.add_argument(
        "--output", type=Path, help="report folder (default: eval-results/<UTC time>/)"
    )
    evaluate.add_argument(
        "--cache-dir",
        type=Path,
        default=Path("ragrank-data/eval-cache"),
        help="corpus embedding cache (ragrank-data/eval-cache)",
    )
    evaluate.add_argument(
        "--baseline-embed-model",
        metavar="MODEL",
        help="also run this embedder's cosine top-100 (cosine-baseline) and compare the "
        "configured embedder against it, e.g. the model it was fine-tuned from",
    )
    evaluate.add_argument("--no-cache", action="store_true", help="always embed the corpus")
    evaluate.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_common(evaluate)
    evaluate.set_defaults(run=_eval)


def _add_store(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store = commands.add_parser(
        "store",
        help="the store: migrate an earlier folder, add BM25 vectors, build the index, show "
        "its state",
        description="migrate: copy every collection that ragrank's earlier embedded engine "
        "(qdrant-client's local mode) wrote in RAGRANK_QDRANT_PATH into Qdrant Edge, keeping "
        "ids, vectors and payloads (nothing is re-embedded); rerun it to finish an interrupted "
        "migration. add-sparse: give every point of the collection (embedded or on a Qdrant "
        "server) its BM25 sparse vector, computed from its stored text with the current "
        "RAGRANK_SPARSE and RAGRANK_BM25_* settings (nothing is re-embedded; rerun it to finish "
        "an interrupted run). optimize: build the HNSW index of points written since the last "
        "build. info: the collection's points, and how many are not yet in the index.",
    )
    store.add_argument("action", choices=("migrate", "add-sparse", "optimize", "info"))
    _add_common(store)
    store.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    store.set_defaults(run=_store)


def _add_common(parser: argparse.ArgumentParser, preset_default: str | None = None) -> None:
    group = parser.add_argument_group("models and store")
    group.add_argument(
        "--preset",
        choices=[*PRESETS, *(["auto"] if preset_default else [])],
        default=preset_default,
        help="model pair: "
        + "; ".join(f"{name} = {embed} + {rerank}" for name, (embed, rerank) in PRESETS.items())
        + ". Explicit RAGRANK_EMBED_MODEL/RAGRANK_RERANK_MODEL still win.",
    )
    group.add_argument("--embed-model", help="hub id or local folder (RAGRANK_EMBED_MODEL)")
    group.add_argument("--rerank-model", help="hub id or local folder (RAGRANK_RERANK_MODEL)")
    group.add_argument("--qdrant-path", type=Path, help="embedded Qdrant folder")
    group.add_argument("--qdrant-url", help="a Qdrant server, e.g. http://localhost:6333")
    group.add_argument("--collection", help="Qdrant collection name")
    group.add_argument("--device", help="auto, cpu, cuda or cuda:N")


def _add_listen(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="interface to listen on (RAGRANK_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (RAGRANK_PORT, 8000)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Environment first, then every flag the user gave."""
    names = (
        "embed_model",
        "rerank_model",
        "qdrant_path",
        "qdrant_url",
        "collection",
        "device",
        "host",
        "port",
        "chunk_tokens",
        "chunk_overlap",
        "index_batch_size",
        "jobs_path",
        "watch",
    )
    flags = {name: getattr(args, name, None) for name in names}
    return Settings.from_env(preset=getattr(args, "preset", None), **flags)


def _serve(args: argparse.Namespace) -> int:
    from server import Services, create_app, serve

    settings = settings_from_args(args)
    services = Services.load(settings)
    try:
        # Only one process may open an embedded Qdrant folder: the API runs the worker then.
        app = create_app(settings, services=services, run_worker=settings.uses_embedded_qdrant)
        serve(app, settings)
    finally:
        services.store.close()
    return 0


def _index(args: argparse.Namespace) -> int:
    from indexing import Indexer, read_documents
    from ragrank.models import SentenceTransformerEmbedder
    from ragrank.store import open_store

    settings = settings_from_args(args)
    embedder = SentenceTransformerEmbedder.from_settings(settings)
    store = open_store(settings)
    try:
        indexer = Indexer.from_settings(settings, embedder, store)
        summary = indexer.index(
            read_documents(args.path),
            origin=str(args.path.resolve()),
            delete_missing=args.delete_missing,
            progress=not args.no_progress,
        )
        store.optimize()
    finally:
        store.close()
    print(summary)
    return 0


def _worker(args: argparse.Namespace) -> int:
    import signal
    import threading

    from indexing.jobs import JobStore
    from indexing.worker import Worker
    from ragrank.models import SentenceTransformerEmbedder
    from ragrank.store import open_store

    settings = settings_from_args(args)
    embedder = SentenceTransformerEmbedder.from_settings(settings)
    store = open_store(settings)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        worker = Worker.from_settings(
            settings, embedder, store, JobStore(settings.jobs_path), optimize_when_idle=True
        )
        logging.getLogger(__name__).info(
            "worker: jobs %s, watching %s", settings.jobs_path, settings.watch or "nothing"
        )
        worker.run(stop)
    finally:
        store.close()
    return 0


def _store(args: argparse.Namespace) -> int:
    from ragrank.store import EdgeStore
    from ragrank.store.legacy import migrate

    settings = settings_from_args(args)
    if args.action == "add-sparse":
        return _add_sparse(settings, [settings.collection], progress=not args.no_progress)
    if not settings.uses_embedded_qdrant:
        raise RagrankError(
            "ragrank store migrate, optimize and info work on the embedded folder "
            "(RAGRANK_QDRANT_PATH); a Qdrant server (RAGRANK_QDRANT_URL) migrates and optimizes "
            "its collections itself"
        )
    if args.action == "migrate":
        moved = migrate(
            settings.qdrant_path,
            lambda name: EdgeStore.from_settings(
                settings.replace(collection=name), allow_legacy=True
            ),
            progress=not args.no_progress,
        )
        for item in moved:
            print(f"{item.collection}: {item.points} points ({item.dimension}-d) copied")
        if settings.sparse != "none":
            _add_sparse(
                settings, [item.collection for item in moved], progress=not args.no_progress
            )
        print(
            f"The earlier engine's files in {settings.qdrant_path} (meta.json, collection/) "
            f"are no longer read and may be deleted."
        )
        return 0
    store = EdgeStore.from_settings(settings)
    try:
        if args.action == "optimize":
            store.optimize()
        print(
            f"{store.collection}: {store.count()} points, {store.unindexed()} not yet in the "
            f"HNSW index, in {store.path}"
        )
    finally:
        store.close()
    return 0


def _add_sparse(settings: Settings, collections: Sequence[str], *, progress: bool) -> int:
    """Give every point of each collection its BM25 vector, from its stored text."""
    from tqdm import tqdm

    from ragrank.sparse import sparse_encoder
    from ragrank.store import open_store

    encoder = sparse_encoder(settings)
    if encoder is None:
        raise RagrankError(
            f"{env_name('sparse')}=none: choose the BM25 tokeniser to add (bm25 or subword)"
        )
    for collection in collections:
        store = open_store(settings.replace(collection=collection))
        try:
            with tqdm(
                total=store.count(),
                desc=f"BM25 vectors of {collection}",
                unit="point",
                disable=not progress,
            ) as bar:
                done = store.add_sparse(encoder, progress=bar.update)
            store.optimize()
        finally:
            store.close()
        print(f"{collection}: BM25 sparse vectors on {done} points ({settings.sparse})")
    return 0


def _models(args: argparse.Namespace) -> int:
    from ragrank import model_files

    settings = settings_from_args(args)
    if args.action == "pull":
        for role, model_id, where in model_files.pull(settings):
            print(f"{role}: {model_id} -> {where}")
        return 0
    statuses = model_files.check(settings)
    for status in statuses:
        if status.loads:
            shape = f"dimension {status.dimension}, " if status.dimension else ""
            print(
                f"ok    {status.role}: {status.model_id} ({status.setting}) from "
                f"{status.source}; {shape}max length {status.max_length}"
            )
        else:
            print(f"FAIL  {status.role}: {status.model_id} ({status.setting}): {status.error}")
    return 0 if all(status.loads for status in statuses) else 1


def _eval(args: argparse.Namespace) -> int:
    try:
        from eval.command import default_output, run_eval
    except ModuleNotFoundError as exc:
        raise RagrankError(
            f"ragrank eval needs the package {exc.name!r}: pip install 'ragrank[eval]'"
        ) from exc
    from eval.suite import EvalOptions
    from ragrank.device import batch_limits, resolve_placement

    settings = settings_from_args(args)
    size, tokens = batch_limits(
        resolve_placement(settings.device, settings.dtype),
        settings.rerank_batch_size,
        settings.rerank_batch_tokens,
    )
    options = EvalOptions(
        systems=tuple(name.strip() for name in args.systems.split(",") if name.strip()),
        split=args.split,
        candidates=args.candidates,
        limit_queries=args.limit_queries,
        cache_dir=None if args.no_cache else args.cache_dir,
        rerank_batch_size=size,
        rerank_batch_tokens=tokens,
        fusion=args.fusion or settings.fusion,
        rrf_k=args.rrf_k or settings.rrf_k,
        rrf_dense_weight=args.rrf_dense_weight or settings.rrf_dense_weight,
        rrf_sparse_weight=args.rrf_sparse_weight or settings.rrf_sparse_weight,
        oracle_k=args.oracle_k,
        progress=not args.no_progress,
    )
    return run_eval(
        settings,
        args.datasets,
        options,
        args.output or default_output(),
        baseline_embed_model=args.baseline_embed_model,
    )


def _finetune(args: argparse.Namespace) -> int:
    try:
        import accelerate  # noqa: F401  (the trainers need both; fail here, with the fix)
        import datasets  # noqa: F401

        from eval.finetune.training import FinetuneOptions

        if args.role == "reranker":
            from eval.finetune.reranker import finetune_reranker as run
        else:
            from eval.finetune.embedder import finetune_embedder as run
    except ModuleNotFoundError as exc:
        raise RagrankError(
            f"ragrank finetune needs the package {exc.name!r}: pip install 'ragrank[finetune]'"
        ) from exc

    held_out = None if args.held_out_split.lower() == "none" else args.held_out_split
    options = FinetuneOptions(
        dataset=args.dataset,
        output=args.output,
        base=args.base,
        split=args.split,
        held_out_split=held_out,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay,
        batch_size=args.batch_size,
        loss=args.loss,
        negatives=args.negatives,
        mine_depth=args.mine_depth,
        near_duplicate=args.near_duplicate,
        validation_fraction=args.validation_fraction,
        validation_candidates=args.validation_candidates,
        max_length=args.max_length,
        seed=args.seed,
        max_steps=args.max_steps,
        cache_dir=None if args.no_cache else args.cache_dir,
        progress=not args.no_progress,
    )
    run(settings_from_args(args), options)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from server.demo import run_demo

    if args.preset == "auto":
        import torch

        args.preset = "default" if torch.cuda.is_available() else "small"
    if args.collection is None and "RAGRANK_COLLECTION" not in os.environ:
        args.collection = DEMO_COLLECTION
    run_demo(settings_from_args(args), serve=not args.no_serve)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
