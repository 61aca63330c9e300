"""The options of `ragrank eval` and `ragrank finetune`: each field is one flag, with its type,
default and help written once here (`ragrank.options` builds the flags). Light on purpose, so
that `ragrank --help` imports no model code."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from eval.splits import SPLIT_BY_HELP, SPLIT_SEED_HELP, TEST_SHARE_HELP, VALIDATION_SHARE_HELP
from eval.systems import DEFAULT_SYSTEMS, SYSTEMS, TOP_K, systems_help
from ragrank.errors import SettingsError
from ragrank.options import option
from ragrank.roles import EMBEDDING, RERANK
from ragrank.settings import FUSIONS

#: Where corpus embeddings are kept between runs, keyed by model and corpus.
EMBEDDING_CACHE = Path("ragrank-data/eval-cache")
_NO_CACHE = ("--no-cache", "always embed the corpus")
_NO_PROGRESS = "hide progress bars"
RELEVANCE = ("same", "any")
QUERY_LANGUAGE = ("auto", "known")


@dataclass(frozen=True)
class EvalTarget:
    """What `ragrank eval` evaluates, and where its report goes."""

    datasets: tuple[Path, ...] = option(
        (),
        "a BEIR-format folder; repeat for several (one row each, plus a macro average)",
        flag="--dataset",
        metavar="DIR",
        repeat=True,
    )
    merge: tuple[Path, ...] = option(
        (),
        "BEIR folders merged into one collection, e.g. one per language (ids prefixed by the "
        "folder's name; one row per query language, plus a macro average)",
        metavar="DIR",
    )
    output: Path | None = option(None, "report folder (default: eval-results/<UTC time>/)")
    baseline_embed_model: str | None = option(
        None,
        "also run this embedder's cosine top-100 (cosine-baseline) and compare the configured "
        "embedder against it, e.g. the model it was fine-tuned from",
        metavar="MODEL",
    )
    against: Path | None = option(
        None,
        "an earlier report (its folder or report.json): compare each system this run shares "
        "with it, query by query on the same datasets, with the paired tests, e.g. after "
        "changing RAGRANK_EMBED_BACKEND",
        metavar="REPORT",
    )

    def __post_init__(self) -> None:
        if not (self.datasets or self.merge):
            raise SettingsError("give at least one --dataset DIR or --merge DIR [DIR ...]")


#: `--exact-search`, for the eval and for fine-tuning's mining alike.
EXACT_SEARCH_HELP = (
    "Qdrant's dense search scans every vector instead of walking the HNSW graph: slower, but "
    "the same first stage every time (each run builds its graph anew, and the build is random)"
)


@dataclass(frozen=True)
class EvalOptions:
    """How `ragrank eval` runs: which systems, on which split, how deep."""

    systems: tuple[str, ...] = option(DEFAULT_SYSTEMS, systems_help(), choices=tuple(SYSTEMS))
    split: str = option("test", "qrels/<split>.tsv to use")
    split_by: str | None = option(
        None, SPLIT_BY_HELP + "; the eval scores the test side's queries only", metavar="FIELD"
    )
    split_seed: int = option(42, SPLIT_SEED_HELP)
    test_share: float = option(0.3, TEST_SHARE_HELP)
    candidates: int = option(100, "first-stage documents the cross-encoder reranks")
    limit_queries: int | None = option(
        None,
        "evaluate the first N judged queries of each dataset (each part's, when merged)",
        metavar="N",
    )
    cache_dir: Path | None = option(EMBEDDING_CACHE, "corpus embedding cache", none_flag=_NO_CACHE)
    rerank_batch_size: int = option(16, cli=False)
    rerank_batch_tokens: int = option(8_192, cli=False)
    encode_batch: int = option(256, cli=False)
    fusion: str = option(
        "dbsf",
        "how hybrid fuses dense and BM25, as the server's",
        setting="fusion",
        choices=FUSIONS,
    )
    rrf_k: int = option(2, "RRF's k", setting="rrf_k")
    rrf_dense_weight: float = option(
        1.0, "RRF's weight of the dense list", setting="rrf_dense_weight"
    )
    rrf_sparse_weight: float = option(
        1.0, "RRF's weight of the BM25 list", setting="rrf_sparse_weight"
    )
    fusion_other_languages: float = option(
        0.6,
        "how much of BM25's part of a hybrid score a passage in another language than the "
        "query's takes from the dense list instead (0: as Qdrant fuses)",
        setting="fusion_other_languages",
    )
    #: The cascade the `cascade` systems evaluate: the settings' (`--cascade`, or
    #: RAGRANK_CASCADE), as the server runs it.
    cascade: str = option("", cli=False)
    cascade_top: tuple[int, ...] = option(
        (), "also evaluate the cascade at each of these K (its curve)", metavar="K"
    )
    #: The first stage's weight the `hybrid-blended` system blends with: the settings'
    #: (`--rerank-blend`, or RAGRANK_RERANK_BLEND), as the server blends.
    rerank_blend: float = option(0.0, cli=False)
    exact_search: bool = option(False, EXACT_SEARCH_HELP)
    versus: tuple[str, ...] = option(
        (),
        "also compare every system against these (e.g. hybrid), per dataset and on the "
        "macro average with a paired test over every query",
        metavar="SYSTEM",
    )
    oracle_k: int | None = option(
        None,
        "depth K of oracle@K, the best reordering of each system's top K (default: --candidates)",
        metavar="K",
    )
    relevance: str = option(
        "same",
        "with --merge, which answers count: `same`, a query's own folder's; `any`, those of "
        "every folder holding the same query id (parallel translations)",
        choices=RELEVANCE,
    )
    query_language: str = option(
        "auto",
        "the language BM25 analyses a query in: `auto`, identified as the server does; `known`, "
        "its folder's name when that is a language code (as a request's `language` names it)",
        choices=QUERY_LANGUAGE,
    )
    progress: bool = option(True, _NO_PROGRESS)

    def __post_init__(self) -> None:
        if self.relevance not in RELEVANCE:
            raise SettingsError(f"--relevance must be one of {', '.join(RELEVANCE)}")
        if self.query_language not in QUERY_LANGUAGE:
            raise SettingsError(f"--query-language must be one of {', '.join(QUERY_LANGUAGE)}")
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown:
            raise SettingsError(
                f"--systems: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SYSTEMS)}"
            )
        if not 1 <= self.candidates <= TOP_K:
            raise SettingsError(f"--candidates must be between 1 and {TOP_K}")
        if self.fusion not in FUSIONS:
            raise SettingsError(f"--fusion must be one of {', '.join(FUSIONS)}")
        if self.rrf_k < 1:
            raise SettingsError("--rrf-k must be at least 1")
        for flag, weight in (
            ("--rrf-dense-weight", self.rrf_dense_weight),
            ("--rrf-sparse-weight", self.rrf_sparse_weight),
        ):
            if not 0.01 <= weight <= 100:
                raise SettingsError(f"{flag} must be between 0.01 and 100")
        if not 0 <= self.fusion_other_languages <= 1:
            raise SettingsError("--fusion-other-languages must be between 0 and 1")
        if any(not 1 <= top <= self.candidates for top in self.cascade_top):
            raise SettingsError("--cascade-top: each K must be between 1 and --candidates")
        unknown = set(self.versus) - set(self.systems) - {"cascade", "cosine"}
        if unknown:
            raise SettingsError(f"--versus: {', '.join(sorted(unknown))} is not among --systems")
        if self.oracle_k is not None and not 1 <= self.oracle_k <= TOP_K:
            raise SettingsError(f"--oracle-k must be between 1 and {TOP_K}")

    def _check_comparisons(self) -> None:
        if self.limit_queries is not None and self.limit_queries < 1:
            raise SettingsError("--limit-queries must be at least 1")
        if not 0 < self.test_share < 1:
            raise SettingsError("--test-share must be in (0, 1)")
        if any(not 1 <= top <= self.candidates for top in self.cascade_top):
            raise SettingsError("--cascade-top: each K must be between 1 and --candidates")
        unknown = set(self.versus) - set(self.systems) - {"cosine"}
        if unknown:
            raise SettingsError(f"--versus: {', '.join(sorted(unknown))} is not among --systems")

    @property
    def oracle_depth(self) -> int:
        return self.oracle_k or self.candidates


LOSSES = ("bce", "listnet", "lce", "mnrl")
#: Where hard negatives come from: the hybrid first stage the server runs (dense and BM25
#: fused), or exact cosine alone.
MINERS = ("hybrid", "cosine")
#: How a student learns its teacher's scores.
DISTIL_LOSSES = ("mse", "margin-mse")


@dataclass(frozen=True)
class FinetuneOptions:
    """The options of `ragrank finetune reranker|embedder`; `FINETUNE_ROLES` holds the defaults
    that differ between the two."""

    output: Path = option(
        help="run folder: checkpoints, report and the model in model/ (rerun to resume)"
    )
    dataset: Path | None = option(None, "BEIR folder to train on", metavar="DIR")
    merge: tuple[Path, ...] = option(
        (),
        "BEIR folders merged into one collection to train on, e.g. one per language (as "
        "ragrank eval --merge: ids prefixed by the folder's name)",
        metavar="DIR",
    )
    split: str = option("train", "qrels/<split>.tsv to train on")
    held_out_split: str | None = option(
        "test", "split whose queries are never trained or validated on ('none': no such split)"
    )
    split_by: str | None = option(
        None,
        SPLIT_BY_HELP + "; replaces --held-out-split and --validation-fraction",
        metavar="FIELD",
    )
    split_seed: int = option(42, SPLIT_SEED_HELP)
    test_share: float = option(0.3, TEST_SHARE_HELP)
    validation_share: float = option(0.1, VALIDATION_SHARE_HELP)
    base: str | None = option(
        None, "model to start from (default: RAGRANK_RERANK_MODEL or RAGRANK_EMBED_MODEL)"
    )
    layers: int | None = option(
        None,
        "keep the base's first N transformer layers (a shallower, faster student)",
        metavar="N",
    )
    teacher: str | None = option(
        None,
        "a reranker (folder or hub id) whose scores the model learns on the mined candidates "
        "(distillation); labels, where there are any, are mixed in by --label-weight",
        metavar="MODEL",
    )
    unlabelled_queries: Path | None = option(
        None,
        "with --teacher: a file of queries without labels (queries.jsonl, or one query a line) "
        "to distil on, e.g. your own traffic; their candidates come from the first stage",
        metavar="FILE",
    )
    distil_loss: str = option(
        "margin-mse",
        "with --teacher: mse on the logits, or margin-mse on (first, other) candidate differences",
        choices=DISTIL_LOSSES,
    )
    label_weight: float = option(
        0.0, "with --teacher: weight of the labelled loss added to the teacher's (0: none)"
    )
    mine_with: str = option("hybrid", "first stage the negatives come from", choices=MINERS)
    exact_search: bool = option(False, EXACT_SEARCH_HELP)
    freeze_embeddings: bool = option(
        False,
        "keep the token embedding table fixed (a third faster on a CPU for a 250k-token "
        "multilingual vocabulary)",
    )
    head_learning_rate: float | None = option(
        None, "learning rate of a fresh head (default: --learning-rate)", metavar="LR"
    )
    validation_queries: int | None = option(
        None,
        "validate on a seeded sample of N validation queries (validation passes cost time)",
        metavar="N",
    )
    eval_every: int | None = option(
        None, "validate and checkpoint every N steps instead of every epoch", metavar="N"
    )
    epochs: float = option(3.0, "training epochs")
    learning_rate: float = option(3e-5, "peak learning rate")
    warmup_ratio: float = option(0.06, "share of the steps spent warming up")
    weight_decay: float = option(0.01, "AdamW weight decay")
    batch_size: int = option(16, "examples per step")
    loss: str = option("bce", "training loss", choices=LOSSES)
    negatives: int = option(4, "hard negatives per query (reranker) or per example (embedder)")
    mine_depth: int = option(30, "cosine top-k the negatives are drawn from")
    near_duplicate: float = option(0.95, "skip candidates this cosine-similar to a positive")
    validation_fraction: float = option(
        0.1, "share of the training queries held out for validation"
    )
    validation_candidates: int = option(20, "cosine candidates per validation query")
    max_length: int = option(256, "token limit while training")
    seed: int = option(42, "seed of the split, the mining and the training")
    max_steps: int | None = option(None, "stop after N steps (smoke runs)", metavar="N")
    cache_dir: Path | None = option(
        EMBEDDING_CACHE, "corpus embedding cache, shared with ragrank eval", none_flag=_NO_CACHE
    )
    progress: bool = option(True, _NO_PROGRESS)

    def __post_init__(self) -> None:
        if self.held_out_split is not None and self.held_out_split.lower() == "none":
            object.__setattr__(self, "held_out_split", None)
        checks = {
            "--epochs must be above 0": self.epochs > 0,
            "--learning-rate must be above 0": self.learning_rate > 0,
            "--warmup-ratio must be in [0, 1)": 0 <= self.warmup_ratio < 1,
            "--weight-decay must be at least 0": self.weight_decay >= 0,
            "--batch-size must be at least 2": self.batch_size >= 2,
            f"--loss must be one of {', '.join(LOSSES)}": self.loss in LOSSES,
            "--negatives must be at least 1": self.negatives >= 1,
            "--mine-depth must be above --negatives": self.mine_depth > self.negatives,
            "--near-duplicate must be in (0, 1]": 0 < self.near_duplicate <= 1,
            "--validation-fraction must be in (0, 0.5]": 0 < self.validation_fraction <= 0.5,
            "--validation-candidates must be at least 10": self.validation_candidates >= 10,
            "--max-length must be at least 16": self.max_length >= 16,
            "--max-steps must be at least 1": self.max_steps is None or self.max_steps >= 1,
            "give --dataset DIR or --merge DIR [DIR ...], not both": (self.dataset is None)
            != (not self.merge),
            "--test-share must be in (0, 1)": 0 < self.test_share < 1,
            "--validation-share must be in (0, 1 - --test-share)": 0
            < self.validation_share
            < 1 - self.test_share,
            "--layers must be at least 1": self.layers is None or self.layers >= 1,
            "--unlabelled-queries needs --teacher": self.unlabelled_queries is None
            or self.teacher is not None,
            f"--distil-loss must be one of {', '.join(DISTIL_LOSSES)}": self.distil_loss
            in DISTIL_LOSSES,
            "--label-weight must be at least 0": self.label_weight >= 0,
            f"--mine-with must be one of {', '.join(MINERS)}": self.mine_with in MINERS,
            "--head-learning-rate must be above 0": self.head_learning_rate is None
            or self.head_learning_rate > 0,
            "--validation-queries must be at least 10": self.validation_queries is None
            or self.validation_queries >= 10,
            "--eval-every must be at least 1": self.eval_every is None or self.eval_every >= 1,
        }
        failed = [message for message, ok in checks.items() if not ok]
        if failed:
            raise SettingsError("; ".join(failed))
        if self.split_by is None and self.held_out_split == self.split:
            raise SettingsError(f"--held-out-split {self.split!r} is the training split")

    def recorded(self) -> dict[str, Any]:
        """The options that shape the run (not how it is shown), JSON-ready."""
        # The folder itself is not an option of the run: a moved run folder still resumes.
        shown = {"progress", "cache_dir", "output"}
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in shown}


def _plain(value: Any) -> Any:
    """A JSON-ready copy of an option's value (paths as strings, tuples as lists)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


@dataclass(frozen=True)
class FinetuneRole:
    """What differs between fine-tuning the reranker and the embedder."""

    help: str
    losses: tuple[str, ...]
    defaults: dict[str, Any]


FINETUNE_ROLES = {
    RERANK.trainee: FinetuneRole(
        "train a one-logit cross-encoder (binary cross-entropy, ListNet, or lce: softmax "
        "cross-entropy of each positive against its hard negatives); --base may be a "
        "cross-encoder or a plain encoder, which gets a fresh head; --teacher distils one",
        ("bce", "listnet", "lce"),
        {"loss": "bce", "batch_size": 16, "negatives": 4},
    ),
    EMBEDDING.trainee: FinetuneRole(
        "train the bi-encoder with multiple negatives ranking (in-batch negatives plus the "
        "mined ones), keeping the query/passage prefixes",
        ("mnrl",),
        {"loss": "mnrl", "batch_size": 32, "negatives": 1},
    ),
}
