"""The retrieval systems `ragrank eval` can run, one registered object each: its name, the first
stage it reorders, what it needs (a Qdrant store, BM25 vectors, the reranker) and how it runs.
The options, the suite, the command and the reports all read `SYSTEMS`; a new system is one
entry here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ragrank.errors import SettingsError
from ragrank.store.fusion import FusionSettings

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from eval.exact import ExactIndex
    from eval.metrics import Run
    from ragrank.cascade import Cascade
    from ragrank.protocols import Reranking, Vectors
    from ragrank.sparse import SparseVector
    from ragrank.store import Store

#: Depth of the first-stage run: Recall@100 and MAP@100 need 100 documents.
TOP_K = 100
#: The system every other is compared against; always run.
BASELINE = "cosine"


class RunOptions(FusionSettings, Protocol):
    """The options a system's run reads (`eval.options.EvalOptions` has them all), the fusion's
    among them."""

    @property
    def candidates(self) -> int: ...
    @property
    def progress(self) -> bool: ...
    @property
    def query_language(self) -> str: ...
    @property
    def cascade(self) -> str: ...
    @property
    def cascade_top(self) -> tuple[int, ...]: ...
    @property
    def rerank_blend(self) -> float: ...
    @property
    def exact_search(self) -> bool: ...


@dataclass
class SystemInputs:
    """What a system's run reads: one dataset's queries and vectors, the runs made before it,
    and what the suite opened for the systems that need it."""

    queries: Mapping[str, str]
    query_vectors: Vectors
    doc_ids: Sequence[str]
    passages: Mapping[str, str]
    index: ExactIndex
    options: RunOptions
    runs: Mapping[str, Run] = field(default_factory=dict)
    store: Store | None = None
    query_sparse: Sequence[SparseVector] = ()
    #: The language each query's BM25 terms were analysed in (see `SparseQuery.language`).
    query_sparse_languages: Sequence[str | None] = ()
    #: The passages are stored with the language BM25 read each in (BM25 `auto`), so hybrid
    #: can tell which of them BM25 could not match, as the server's does.
    languages_stored: bool = False
    #: The inference whose default reranker reranks.
    reranker: Reranking | None = None
    #: Timings beyond the suite's per-query milliseconds (a reranker's pairs/s), and the
    #: pairs each reranker scored per query (`<system>_pairs_per_query`).
    timings: dict[str, float] = field(default_factory=dict)
    #: Runs a system adds beside its own (the cascade at each `--cascade-top`).
    extra_runs: dict[str, Run] = field(default_factory=dict)
    #: A reranking system → the reranker it ran (None: the default) and its logit of each
    #: reranked (query, document): what the reliability of its scores is measured on.
    reranked: dict[str, tuple[str | None, Run]] = field(default_factory=dict)


@dataclass(frozen=True)
class System:
    """One retrieval system of the eval."""

    name: str
    help: str
    run: Callable[[System, SystemInputs], Run]
    #: The system whose top `--candidates` this one reorders.
    first_stage: str | None = None
    needs_store: bool = False
    needs_sparse: bool = False
    needs_reranker: bool = False
    #: Run when `--systems` is not given.
    default: bool = True
    #: The report's timing key: `<timing>_ms_per_query`.
    timing: str = ""
    #: The report lists its largest per-query wins and losses against the baseline.
    extremes: bool = True

    @property
    def timing_key(self) -> str:
        return f"{self.timing or self.name.replace('-', '_')}_ms_per_query"


def _cosine(system: System, inputs: SystemInputs) -> Run:
    from eval.runs import exact_run

    query_ids = list(inputs.queries)
    return exact_run(inputs.index, query_ids, inputs.query_vectors, inputs.doc_ids, TOP_K)


def _searched(dense: bool, sparse: bool) -> Callable[[System, SystemInputs], Run]:
    """Qdrant's own search, as the server's first stage runs it: dense through the HNSW graph
    (or scanning every vector, with `--exact-search`), BM25, or both fused in one Query API
    call."""

    def run(system: System, inputs: SystemInputs) -> Run:
        from eval.runs import store_run
        from ragrank.store import Fusion

        if inputs.store is None:
            raise ValueError(f"the {system.name} system needs a Qdrant store")
        fusion = Fusion.from_settings(inputs.options)
        return store_run(
            inputs.store,
            list(inputs.queries),
            TOP_K,
            dense=inputs.query_vectors if dense else None,
            sparse=inputs.query_sparse if sparse else None,
            fusion=fusion if dense and sparse else None,
            languages=inputs.query_sparse_languages if inputs.languages_stored else (),
            exact=inputs.options.exact_search,
        )

    return run


def _reranked(system: System, inputs: SystemInputs) -> Run:
    """The cross-encoder over the first stage's top `--candidates`."""
    import time

    from eval.runs import ranked, rerank_run

    if inputs.reranker is None:
        raise ValueError(f"the {system.name} system needs a reranking model")
    if system.first_stage is None:
        raise ValueError(f"the {system.name} system names no first stage")
    options = inputs.options
    start = time.perf_counter()
    fast = system.name == CASCADE_FIRST
    model = _cascade_rule(options).model if fast else None
    first = inputs.runs[system.first_stage]
    run, pairs = rerank_run(
        inputs.reranker,
        inputs.queries,
        first,
        inputs.passages,
        candidates=options.candidates,
        progress=options.progress,
        model=model,
    )
    inputs.reranked[system.name] = (
        model,
        {
            qid: {
                doc_id: run[qid][doc_id]
                for doc_id in ranked(first.get(qid, {}))[: options.candidates]
            }
            for qid in inputs.queries
        },
    )
    label = system.timing_key.removesuffix("_ms_per_query")
    inputs.timings[f"{label}_pairs_per_s"] = pairs / max(time.perf_counter() - start, 1e-9)
    stage = "fast" if fast else "default"
    inputs.timings[f"{system.name}_{stage}_pairs_per_query"] = pairs / max(len(inputs.queries), 1)
    return run


def _cascade_rule(options: RunOptions) -> Cascade:
    """The cascade `--cascade` (default: RAGRANK_CASCADE) names; refused when it is empty."""
    from ragrank.cascade import Cascade

    rule = Cascade.parse(options.cascade, "--cascade")
    if rule is None:
        raise SettingsError(
            "the cascade systems need a cascade: set RAGRANK_CASCADE or --cascade NAME:K"
        )
    return rule


def _cascade(system: System, inputs: SystemInputs) -> Run:
    """The cascade over hybrid's top `--candidates`, at the rule's K and at each
    `--cascade-top` (`cascade@K` runs beside it). The default reranker's scores come from
    `hybrid-reranked` when it ran over the same candidates (the same pairs), else are
    scored here. `cascade-blended` applies `--rerank-blend` to both stages, as the server
    does when both are set, and adds the fast reranker alone blended with hybrid
    (`cascade-first-blended`), from the scores `cascade-first` gave."""
    from eval.runs import blended_run, cascade_run

    if inputs.reranker is None:
        raise ValueError(f"the {system.name} system needs a reranking model")
    options = inputs.options
    rule = _cascade_rule(options)
    blend = _blend_weight(system, options) if system.name == CASCADE_BLENDED else 0.0
    first = inputs.runs[CASCADE_STAGE]
    fast = inputs.timings.get(f"{CASCADE_FIRST}_fast_pairs_per_query")
    result: Run = {}
    for top in dict.fromkeys((rule.top, *options.cascade_top)):
        run, pairs = cascade_run(
            inputs.reranker,
            inputs.queries,
            first,
            inputs.runs[CASCADE_FIRST],
            inputs.passages,
            candidates=options.candidates,
            top=top,
            large=inputs.runs.get(CASCADE_LARGE),
            blend=blend,
            progress=options.progress,
        )
        name = system.name if top == rule.top else f"{system.name}@{top}"
        inputs.timings[f"{name}_default_pairs_per_query"] = pairs / max(len(inputs.queries), 1)
        # The fast model's pairs are cascade-first's: it scored every candidate once.
        if fast is not None:
            inputs.timings[f"{name}_fast_pairs_per_query"] = fast
        if top == rule.top:
            result = run
        else:
            inputs.extra_runs[name] = run
    if blend and CASCADE_FIRST in inputs.reranked:
        name = CASCADE_FIRST_BLENDED
        inputs.extra_runs[name] = blended_run(
            first, inputs.reranked[CASCADE_FIRST][1], candidates=options.candidates, blend=blend
        )
        if fast is not None:
            inputs.timings[f"{name}_fast_pairs_per_query"] = fast
    return result


def _blend_weight(system: System, options: RunOptions) -> float:
    """`--rerank-blend` (default: RAGRANK_RERANK_BLEND); refused at 0, which would make a
    blended system its unblended twin."""
    if not options.rerank_blend:
        raise SettingsError(
            f"the {system.name} system needs a blend above 0: set RAGRANK_RERANK_BLEND or "
            "--rerank-blend W"
        )
    return options.rerank_blend


def _blended(system: System, inputs: SystemInputs) -> Run:
    """Hybrid's top reranked, in the blend of hybrid's order and the reranker's that the server
    gives with RAGRANK_RERANK_BLEND (`ragrank.blend`). It reuses `hybrid-reranked`'s scores:
    the same pairs, scored once."""
    from eval.runs import blended_run

    weight = _blend_weight(system, inputs.options)
    _, scores = inputs.reranked[BLEND_RERANKED]
    pairs = inputs.timings.get(f"{BLEND_RERANKED}_default_pairs_per_query")
    if pairs is not None:
        inputs.timings[f"{system.name}_default_pairs_per_query"] = pairs
    return blended_run(
        inputs.runs[CASCADE_STAGE], scores, candidates=inputs.options.candidates, blend=weight
    )


#: The cascade's systems: its first stage, the large (default) reranker alone over it, and the
#: fast reranker alone over it.
CASCADE_STAGE = "hybrid"
CASCADE_LARGE = "hybrid-reranked"
CASCADE_FIRST = "cascade-first"
CASCADE_BLENDED = "cascade-blended"
#: The reranked run the blend reorders (over the cascade's first stage, hybrid).
BLEND_RERANKED = CASCADE_LARGE
#: The large reranker's order and the fast one's alone, each blended with hybrid's.
LARGE_BLENDED = "hybrid-blended"
CASCADE_FIRST_BLENDED = f"{CASCADE_FIRST}-blended"

#: Every system, each after the first stage it reorders.
SYSTEMS: dict[str, System] = {
    system.name: system
    for system in (
        System(
            BASELINE,
            "exact cosine top-100 (faiss); always run: the baseline",
            _cosine,
            timing="retrieval",
            extremes=False,
        ),
        System(
            "ann",
            "Qdrant's dense search through its HNSW graph",
            _searched(dense=True, sparse=False),
            needs_store=True,
            extremes=False,  # the HNSW graph's approximation of cosine
        ),
        System(
            "bm25",
            "Qdrant's BM25 search",
            _searched(dense=False, sparse=True),
            needs_store=True,
            needs_sparse=True,
        ),
        System(
            "hybrid",
            "dense and BM25 fused by Qdrant (--fusion)",
            _searched(dense=True, sparse=True),
            needs_store=True,
            needs_sparse=True,
        ),
        System(
            "reranked",
            "cosine's top reranked",
            _reranked,
            first_stage=BASELINE,
            needs_reranker=True,
            timing="rerank",
        ),
        System(
            "hybrid-reranked",
            "hybrid's top reranked",
            _reranked,
            first_stage="hybrid",
            needs_reranker=True,
            default=False,
        ),
        System(
            LARGE_BLENDED,
            "hybrid's top reranked, ordered by a blend of hybrid's order and the reranker's "
            "(--rerank-blend)",
            _blended,
            first_stage=BLEND_RERANKED,
            needs_reranker=True,
            default=False,
        ),
        System(
            CASCADE_FIRST,
            "hybrid's top reranked by the cascade's fast reranker alone (--cascade)",
            _reranked,
            first_stage=CASCADE_STAGE,
            needs_reranker=True,
            default=False,
        ),
        System(
            "cascade",
            "hybrid's top reranked by the cascade (--cascade NAME:K): the fast reranker scores "
            "every candidate, the default one rescores its top K (and each --cascade-top K)",
            _cascade,
            first_stage=CASCADE_FIRST,
            needs_reranker=True,
            default=False,
        ),
        System(
            CASCADE_BLENDED,
            "the cascade with each stage's order blended with hybrid's (--rerank-blend), at "
            "each K as cascade; beside it, the fast reranker alone blended "
            "(cascade-first-blended)",
            _cascade,
            first_stage=CASCADE_FIRST,
            needs_reranker=True,
            default=False,
        ),
    )
}
DEFAULT_SYSTEMS = tuple(name for name, system in SYSTEMS.items() if system.default)


def plan(chosen: Sequence[str]) -> list[System]:
    """The systems to run for `chosen`, in registry order: the baseline, each chosen one, and
    the first stage of each that reorders one."""
    wanted = {BASELINE, *chosen}
    for name in list(wanted):
        stage = SYSTEMS[name].first_stage
        while stage is not None:
            wanted.add(stage)
            stage = SYSTEMS[stage].first_stage
    return [system for name, system in SYSTEMS.items() if name in wanted]


def systems_help() -> str:
    """The `--systems` help, from the registry."""
    listed = ", ".join(f"{name} ({system.help})" for name, system in SYSTEMS.items())
    return f"runs, separated by commas or spaces: {listed}"
