"""The `ragrank` command: each subcommand builds `Settings` from the environment and its
flags, then hands over to one door. A door's code is imported when its command runs, so that
`--help` loads no model code; the flags of `eval`, `finetune` and `bench` come from their
options dataclasses, light modules read while the parser is built."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from cli.stack import run_stack
from ragrank import __version__
from ragrank.errors import RagrankError
from ragrank.logs import configure_logging
from ragrank.options import add_options, add_setting_flags, options_from_args, settings_overrides
from ragrank.settings import Settings, env_name

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

DEMO_COLLECTION = "ragrank-demo"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    command: Callable[[argparse.Namespace], int] = args.run
    try:
        settings = Settings.from_env()
        configure_logging(settings.log_format, settings.log_level)
        code: int = partial(command, args)()
    except RagrankError as exc:
        print(f"ragrank: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragrank",
        description="Retrieval from Qdrant with cross-encoder reranking. Every model and store "
        "flag has a RAGRANK_* environment variable (docs/configuration.md); flags win.",
    )
    parser.add_argument("--version", action="version", version=f"ragrank {__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        subcommand = commands.add_parser(name, help=command.help, description=command.description)
        command.add_flags(subcommand)
        if command.run is not None:
            subcommand.set_defaults(run=command.run)
    return parser


@dataclass(frozen=True)
class _Command:
    help: str
    description: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    #: None for a command whose own subcommands say what runs (finetune's models).
    run: Callable[[argparse.Namespace], int] | None


def _serve_flags(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    _add_listen(parser)


def _index_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="a .jsonl/.jsonl.gz file or a folder")
    _add_common(parser)
    add_setting_flags(parser.add_argument_group("chunking"), "index")
    parser.add_argument(
        "--delete-missing",
        action="store_true",
        help="delete documents indexed earlier from this PATH that it no longer holds",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _worker_flags(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    add_setting_flags(parser.add_argument_group("jobs"), "worker")


def _demo_flags(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    _add_listen(parser)
    parser.add_argument(
        "--no-serve", action="store_true", help="exit after the examples instead of serving"
    )


def _models_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("pull", "check"))
    _add_common(parser)


def _eval_flags(parser: argparse.ArgumentParser) -> None:
    from eval.options import EvalOptions, EvalTarget

    add_options(parser, EvalTarget)
    add_options(parser, EvalOptions)
    _add_common(parser)


def _finetune_flags(parser: argparse.ArgumentParser) -> None:
    from eval.options import FINETUNE_ROLES, FinetuneOptions

    roles = parser.add_subparsers(title="models", required=True, metavar="MODEL")
    for role, spec in FINETUNE_ROLES.items():
        model = roles.add_parser(role, help=spec.help, description=spec.help + ".")
        add_options(model, FinetuneOptions, defaults=spec.defaults, choices={"loss": spec.losses})
        _add_common(model)
        model.set_defaults(run=_finetune, role=role)


def _bench_flags(parser: argparse.ArgumentParser) -> None:
    from eval.bench.options import BenchOptions

    add_options(parser, BenchOptions)


def _store_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("migrate", "add-sparse", "optimize", "info"))
    _add_common(parser)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_setting_flags(parser.add_argument_group("models and store"), "models")


def _add_listen(parser: argparse.ArgumentParser) -> None:
    add_setting_flags(parser.add_argument_group("listening"), "listen")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Environment first, then every flag the user gave."""
    return Settings.from_env(**settings_overrides(args))


def _serve(args: argparse.Namespace) -> int:
    run_stack(settings_from_args(args))
    return 0


def _index(args: argparse.Namespace) -> int:
    from indexing import Indexer, read_documents
    from ragrank.backends.serving import load_inference
    from ragrank.store import open_store

    settings = settings_from_args(args)
    inference = load_inference(settings, rerankers=False)
    store = open_store(settings)
    try:
        with inference.running():
            indexer = Indexer.from_settings(settings, inference.bulk_embedder(), store)
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

    from indexing import Worker
    from ragrank.backends.serving import load_inference
    from ragrank.jobs import open_job_queue
    from ragrank.store import open_store

    settings = settings_from_args(args)
    jobs = open_job_queue(settings)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    # The queue first: a worker it refuses stops before loading models or opening the store.
    with jobs.as_worker(embedded_store=settings.uses_embedded_qdrant):
        inference = load_inference(settings, rerankers=False)
        store = open_store(settings)
        try:
            with inference.running():
                worker = Worker.from_settings(
                    settings, inference.bulk_embedder(), store, jobs, optimize_when_idle=True
                )
                logging.getLogger(__name__).info(
                    "worker: jobs %s, watching %s", jobs.describe(), settings.watch or "nothing"
                )
                worker.run(stop)
        finally:
            store.close()
            jobs.close()
    return 0


def _store(args: argparse.Namespace) -> int:
    from ragrank.store import maintenance

    settings = settings_from_args(args)
    progress = not args.no_progress
    if args.action == "add-sparse":
        _print_sparse(
            settings,
            maintenance.add_sparse_vectors(settings, [settings.collection], progress=progress),
        )
        return 0
    if args.action == "migrate":
        moved = maintenance.migrate_folder(settings, progress=progress)
        for item in moved:
            print(f"{item.collection}: {item.points} points ({item.dimension}-d) copied")
        print(
            f"The earlier engine's files in {settings.qdrant_path} (meta.json, collection/) "
            f"are no longer read and may be deleted."
        )
        return 0
    state = maintenance.shard_state(settings, optimize=args.action == "optimize")
    print(
        f"{state.collection}: {state.points} points, {state.unindexed} not yet in the "
        f"HNSW index, in {state.path}"
    )
    return 0


def _print_sparse(settings: Settings, done: dict[str, int]) -> None:
    for collection, points in done.items():
        print(f"{collection}: BM25 sparse vectors on {points} points ({settings.sparse})")


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
            backend = f"; {status.backend}" if status.backend != "torch" else ""
            print(
                f"ok    {status.role}: {status.model_id} ({status.setting}) from "
                f"{status.source}; {shape}max length {status.max_length}{backend}"
            )
        else:
            print(f"FAIL  {status.role}: {status.model_id} ({status.setting}): {status.error}")
    return 0 if all(status.loads for status in statuses) else 1


def _eval(args: argparse.Namespace) -> int:
    try:
        from eval.command import default_output, run_eval
    except ModuleNotFoundError as exc:
        raise RagrankError(
            f"ragrank eval needs the package {exc.name!r}: pip install 'ragrank[eval]' "
            "('ragrank[gpu]' instead on a CUDA machine)"
        ) from exc
    from eval.options import EvalOptions, EvalTarget
    from ragrank.device import batch_limits, resolve_placement

    settings = settings_from_args(args)
    size, tokens = batch_limits(
        resolve_placement(settings.device, settings.dtype),
        settings.rerank_batch_size,
        settings.rerank_batch_tokens,
    )
    options = options_from_args(
        EvalOptions, args, settings, rerank_batch_size=size, rerank_batch_tokens=tokens
    )
    target = options_from_args(EvalTarget, args)
    return run_eval(
        settings,
        target.datasets,
        options,
        target.output or default_output(),
        baseline_embed_model=target.baseline_embed_model,
        merge=target.merge,
        against_report=target.against,
    )


def _finetune(args: argparse.Namespace) -> int:
    try:
        import accelerate  # noqa: F401  (the trainers need both; fail here, with the fix)
        import datasets  # noqa: F401

        if args.role == "reranker":
            from eval.finetune.reranker import finetune_reranker as run
        else:
            from eval.finetune.embedder import finetune_embedder as run
    except ModuleNotFoundError as exc:
        raise RagrankError(
            f"ragrank finetune needs the package {exc.name!r}: pip install 'ragrank[finetune]'"
        ) from exc
    from eval.options import FinetuneOptions

    run(settings_from_args(args), options_from_args(FinetuneOptions, args))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from eval.bench.load import run
    from eval.bench.options import BenchOptions

    return run(options_from_args(BenchOptions, args))


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from cli.demo import announce, demo_settings, show_demo

    if args.preset is None and env_name("preset") not in os.environ:
        import torch

        # The demo's pair fits the machine: the production one needs a GPU to feel responsive.
        args.preset = "default" if torch.cuda.is_available() else "small"
    if args.collection is None and "RAGRANK_COLLECTION" not in os.environ:
        args.collection = DEMO_COLLECTION
    settings = demo_settings(settings_from_args(args))
    console = Console()
    started = announce(settings, console)
    run_stack(
        settings,
        prepare=lambda services: show_demo(services, settings, console, started=started),
        serve=not args.no_serve,
    )
    return 0


#: Each subcommand: (help, description, the function that adds its flags, what it runs).
COMMANDS: dict[str, _Command] = {
    "serve": _Command(
        "run the REST API (/v1/search, /health, /ready, /schema)",
        "Load the models, open Qdrant (embedded folder, or a server with "
        "RAGRANK_QDRANT_URL) and serve the REST API. On an embedded folder the indexing worker "
        "runs in the same process.",
        _serve_flags,
        _serve,
    ),
    "index": _Command(
        "chunk, embed and upsert documents into Qdrant",
        "Sync a JSONL file ('id' or '_id', 'text', optional 'title' and "
        "'metadata'), a BEIR corpus.jsonl(.gz), or a folder of .txt/.md/.html files into "
        "Qdrant. Unchanged documents are skipped without embedding, changed ones replaced; a "
        "run that was killed is completed by the next one.",
        _index_flags,
        _index,
    ),
    "worker": _Command(
        "run the indexing worker: jobs from the API and watched folders",
        "Run queued jobs (POST/DELETE /v1/documents) from the SQLite queue at "
        "RAGRANK_JOBS_PATH and keep the RAGRANK_WATCH folders in sync, until interrupted. "
        "With an embedded Qdrant folder, `ragrank serve` already runs the worker itself.",
        _worker_flags,
        _worker,
    ),
    "demo": _Command(
        "index the bundled sample corpus, show cosine vs reranked order, then serve",
        "Index the bundled multilingual sample (124 short documents, 16 labelled "
        f"queries) into the collection '{DEMO_COLLECTION}', print a few queries in cosine and "
        "in reranked order, then serve the API. Without --preset it picks 'small' models on a "
        "machine without CUDA, else 'default'.",
        _demo_flags,
        _demo,
    ),
    "models": _Command(
        "pull the configured models into the cache, or check that they load",
        "pull: download the configured embedding and reranking models into the "
        "Hugging Face cache (HF_HOME), so the stack can start offline. check: load each "
        "through the server's own code and report where from, its dimension and max length; "
        "exits 1 if any fails.",
        _models_flags,
        _models,
    ),
    "store": _Command(
        "the store: migrate an earlier folder, add BM25 vectors, build the index, show its state",
        "migrate: copy every collection that ragrank's earlier embedded engine "
        "(qdrant-client's local mode) wrote in RAGRANK_QDRANT_PATH into Qdrant Edge, keeping "
        "ids, vectors and payloads (nothing is re-embedded); rerun it to finish an interrupted "
        "migration. add-sparse: give every point of the collection (embedded or on a Qdrant "
        "server) its BM25 sparse vector, computed from its stored text with the current "
        "RAGRANK_SPARSE and RAGRANK_BM25_* settings (nothing is re-embedded; rerun it to finish "
        "an interrupted run). optimize: build the HNSW index of points written since the last "
        "build. info: the collection's points, and how many are not yet in the index.",
        _store_flags,
        _store,
    ),
    "eval": _Command(
        "NDCG@10 of cosine, BM25, hybrid and reranked retrieval on BEIR datasets",
        "Evaluate on BEIR-format collections (corpus.jsonl(.gz), queries.jsonl, "
        "qrels/<split>.tsv): exact cosine top-100 with faiss, Qdrant's own dense (ANN), BM25 "
        "and hybrid search, and the cross-encoder over a first stage's top --candidates. "
        "Prints NDCG@10 per dataset with paired significance tests against cosine, bootstrap "
        "CIs, per-query wins/ties/losses and each system's oracle@K (the best any reranker "
        "could do with its top K); writes report.json, report.md and plots to --output.",
        _eval_flags,
        _eval,
    ),
    "finetune": _Command(
        "fine-tune the reranker or the embedder on a BEIR collection's relevance labels",
        "Domain adaptation: train on qrels/<split>.tsv with hard negatives mined "
        "from the configured embedder's cosine top-k, validate on held-out train queries, keep "
        "the best checkpoint by validation NDCG@10 and save a model folder for "
        "RAGRANK_RERANK_MODEL or RAGRANK_EMBED_MODEL. Queries of --held-out-split are never "
        "seen. Rerun the same command to resume an interrupted run.",
        _finetune_flags,
        None,
    ),
    "bench": _Command(
        "load-test /v1/rerank against the model-only ceiling, other batching and Infinity",
        "/v1/rerank under concurrent load against what the model alone can do: "
        "the in-process ceiling, `ragrank serve` with sorted, arrival-order and per-request "
        "batching, and Infinity on the same model when it is installed. --host-only measures "
        "the host path with a zero-layer model instead. Prints pairs/s, p50/p99 latency and "
        "the ratios; writes JSON.",
        _bench_flags,
        _bench,
    ),
}
