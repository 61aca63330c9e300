"""One frozen settings object, built from `RAGRANK_*` environment variables and CLI flags."""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrank.errors import SettingsError

ENV_PREFIX = "RAGRANK_"

#: The batching policies of `server/batching.py`.
BATCHINGS = ("sorted", "arrival", "request")
#: `auto` writes JSON lines unless stderr is a terminal (see `ragrank/logs.py`).
LOG_FORMATS = ("auto", "json", "text")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: The sparse (BM25) tokenisers of `ragrank/sparse.py`, and `none` for dense vectors only.
SPARSE_KINDS = ("bm25", "subword", "none")
#: What the first stage retrieves with, and how hybrid retrieval fuses its two lists.
RETRIEVALS = ("dense", "sparse", "hybrid")
FUSIONS = ("rrf", "dbsf")

#: The request limits and the most each may be set to (the OpenAPI schema's hard bounds).
LIMIT_CEILINGS = {
    "max_query_chars": 20_000,
    "max_top_k": 1_000,
    "max_candidates": 5_000,
    "max_rerank_documents": 10_000,
    "max_document_chars": 1_000_000,
    "max_embed_inputs": 20_480,
    "max_ingest_documents": 10_000,
    "max_ingest_document_chars": 10_000_000,
}

DEFAULT_EMBED_MODEL = "intfloat/multilingual-e5-base"
DEFAULT_RERANK_MODEL = "BAAI/bge-reranker-v2-m3"

#: Model presets. `small` suits machines without a GPU; `default` is the production pair.
PRESETS: dict[str, tuple[str, str]] = {
    "default": (DEFAULT_EMBED_MODEL, DEFAULT_RERANK_MODEL),
    "small": ("intfloat/multilingual-e5-small", "cross-encoder/mmarco-mMiniLMv2-L12-H384-v1"),
}


def default_prefixes(embed_model: str) -> tuple[str, str]:
    """The (query, passage) prefixes a model was trained with: those a local folder records
    as its sentence-transformers prompts (`ragrank finetune embedder` writes them), else role
    prefixes for e5 models."""
    recorded = Path(embed_model).expanduser() / "config_sentence_transformers.json"
    if recorded.is_file():
        try:
            prompts = json.loads(recorded.read_text(encoding="utf-8")).get("prompts") or {}
        except (OSError, ValueError):
            prompts = {}
        if isinstance(prompts.get("query"), str) and isinstance(prompts.get("passage"), str):
            return prompts["query"], prompts["passage"]
    if "e5" in embed_model.lower():
        return "query: ", "passage: "
    return "", ""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every knob of ragrank. Each field `name` is read from the variable `RAGRANK_<NAME>`."""

    embed_model: str = DEFAULT_EMBED_MODEL
    rerank_model: str = DEFAULT_RERANK_MODEL
    #: None means "derive from the embedding model's name" (see `default_prefixes`); an empty
    #: variable means no prefix.
    query_prefix: str | None = field(default=None, metadata={"empty_is_value": True})
    passage_prefix: str | None = field(default=None, metadata={"empty_is_value": True})

    qdrant_path: Path = Path("ragrank-data/qdrant")
    qdrant_url: str | None = None
    qdrant_api_key: str | None = field(default=None, repr=False)
    collection: str = "ragrank"
    #: Applied when ragrank creates the collection on a Qdrant server (cluster mode); an
    #: existing collection keeps its own. The embedded store ignores them.
    qdrant_shard_number: int = 1
    qdrant_replication_factor: int = 1
    qdrant_write_consistency_factor: int = 1
    #: The vector index (HNSW) of a new collection: edges per node and build width; an
    #: existing collection keeps its graph until rebuilt. The defaults are chosen by measured
    #: recall against exact search (see the README's store section).
    hnsw_m: int = 16
    hnsw_ef_construct: int = 100
    #: Candidates each search explores in the graph; more is slower and closer to exact.
    hnsw_ef: int = 128
    #: KiB of vectors from which a segment gets a graph; smaller ones are scanned exactly.
    hnsw_indexing_threshold_kb: int = 10_000
    #: The share of a segment's points deleted or overwritten from which the store rebuilds
    #: it without them. 0 rebuilds any segment with a deletion at the next index build,
    #: which keeps BM25's IDF statistics exact; higher rebuilds less often.
    vacuum_deleted_ratio: float = 0.0
    #: The BM25 sparse vector stored beside the dense one: `bm25` (Qdrant's BM25, a
    #: multilingual word tokenizer), `subword` (the embedding model's tokenizer) or `none`.
    #: It and the `bm25_*` settings are part of each document's stamp: a change re-indexes.
    sparse: str = "bm25"
    #: Stopwords and stemmer of `sparse=bm25`: a language name, or `none` for neither.
    bm25_language: str = "english"
    bm25_k: float = 1.2
    bm25_b: float = 0.75
    #: The chunk length, in terms, that BM25's length normalisation is relative to.
    bm25_avg_len: float = 256.0
    #: What a search retrieves its candidates with when the request does not say: `dense`,
    #: `sparse` or `hybrid` (both, fused), and how: `dbsf` or `rrf` (with `rrf_k`). The
    #: defaults measured best on SciFact and XQuAD-R (README, hybrid retrieval).
    retrieval: str = "hybrid"
    fusion: str = "dbsf"
    rrf_k: int = 2
    #: RRF's weights of the dense and the BM25 lists (Qdrant divides a list's positions by
    #: its weight).
    rrf_dense_weight: float = 1.0
    rrf_sparse_weight: float = 1.0

    device: str = "auto"
    dtype: str = "auto"
    #: Batch limits per forward pass; 0 picks a default for the device (see `device.py`).
    embed_batch_size: int = 0
    embed_batch_tokens: int = 0
    rerank_batch_size: int = 0
    rerank_batch_tokens: int = 0
    rerank_max_length: int = 512
    #: `torch` runs the model as loaded; `int8` (CPU only) quantises its linear layers and is
    #: used only if its rankings agree with the float model's (see `ragrank/quantization.py`).
    rerank_backend: str = "torch"
    #: Least mean per-query Spearman correlation with the float scores that `int8` must reach.
    rerank_min_agreement: float = 0.9
    #: `on` packs each batch's sequences into one row without padding and runs varlen
    #: attention (BERT and XLM-R families); `auto` packs on CUDA only (see `ragrank/packing.py`).
    packed: str = "auto"
    #: The varlen attention kernel of packed batches: auto, flash-attn, torch or sdpa.
    varlen_attention: str = "auto"
    #: Host threads that tokenise, plan windows and collate batches, each with its own
    #: tokenizer copy; 0 means one per core but one, at least 1.
    tokenizer_threads: int = 0
    #: How queued items become batches: sorted, arrival or request (see `server/batching.py`).
    batching: str = "sorted"
    #: How long the batching engine waits for concurrent requests to join a batch.
    batch_wait_ms: int = 5
    #: Items waiting per model before new requests get 429.
    queue_size: int = 4096
    request_timeout_s: int = 60

    chunk_tokens: int = 256
    chunk_overlap: int = 32
    index_batch_size: int = 64
    #: Comma-separated metadata keys that get a payload index (embedded or on a server).
    metadata_indexes: str = ""
    #: The durable job queue (SQLite) shared by the API and the worker.
    jobs_path: Path = Path("ragrank-data/jobs.sqlite3")
    #: Comma-separated folders the worker keeps in sync (with delete-missing).
    watch: str = ""
    watch_interval_s: int = 30

    #: The largest request body the server reads; a larger one is answered 413 unread.
    max_request_bytes: int = 16 * 1024 * 1024
    #: Request limits, each checked before any model work (400 naming the field and the
    #: variable); at most `LIMIT_CEILINGS`.
    max_query_chars: int = 2_000
    max_top_k: int = 100
    max_candidates: int = 500
    max_rerank_documents: int = 1_000
    max_document_chars: int = 100_000
    max_embed_inputs: int = 2_048
    max_ingest_documents: int = 1_000
    max_ingest_document_chars: int = 1_000_000

    #: API keys (comma-separated, and/or one per line in a file). With none, the API is open;
    #: with any, every route but /health and /ready needs one. Read-only keys cannot ingest.
    api_keys: str = field(default="", repr=False)
    readonly_api_keys: str = field(default="", repr=False)
    api_keys_file: Path | None = None
    readonly_api_keys_file: Path | None = None

    log_format: str = "auto"
    log_level: str = "INFO"

    host: str = "127.0.0.1"
    port: int = 8000

    def __post_init__(self) -> None:
        # An empty variable (as compose files pass them) means "not set".
        for name in ("qdrant_url", "qdrant_api_key"):
            if getattr(self, name) == "":
                object.__setattr__(self, name, None)
        query, passage = default_prefixes(self.embed_model)
        if self.query_prefix is None:
            object.__setattr__(self, "query_prefix", query)
        if self.passage_prefix is None:
            object.__setattr__(self, "passage_prefix", passage)
        self._check_values()
        if self.sparse == "none" and self.retrieval != "dense":
            raise SettingsError(
                f"{env_name('retrieval')}={self.retrieval} needs sparse vectors, but "
                f"{env_name('sparse')}=none; set {env_name('retrieval')}=dense"
            )

    def _check_values(self) -> None:
        for name in (
            "rerank_max_length",
            "chunk_tokens",
            "index_batch_size",
            "queue_size",
            "request_timeout_s",
            "watch_interval_s",
            "qdrant_shard_number",
            "qdrant_replication_factor",
            "qdrant_write_consistency_factor",
            "hnsw_m",
            "hnsw_ef_construct",
            "hnsw_ef",
            "hnsw_indexing_threshold_kb",
            "rrf_k",
            "max_request_bytes",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{env_name(name)} must be at least 1")
        for name in (
            "embed_batch_size",
            "embed_batch_tokens",
            "rerank_batch_size",
            "rerank_batch_tokens",
            "batch_wait_ms",
            "tokenizer_threads",
        ):
            if getattr(self, name) < 0:
                raise SettingsError(f"{env_name(name)} must be 0 (automatic) or more")
        if not 0 <= self.chunk_overlap < self.chunk_tokens:
            raise SettingsError(
                f"{env_name('chunk_overlap')} must be >= 0 and below {env_name('chunk_tokens')}"
            )
        if self.qdrant_write_consistency_factor > self.qdrant_replication_factor:
            raise SettingsError(
                f"{env_name('qdrant_write_consistency_factor')} cannot exceed "
                f"{env_name('qdrant_replication_factor')}: a write cannot wait for more copies "
                f"than exist"
            )
        for name, ceiling in LIMIT_CEILINGS.items():
            # A request that leaves out top_k or candidates gets their defaults (10, 50).
            floor = {"max_top_k": 10, "max_candidates": 50}.get(name, 1)
            if not floor <= getattr(self, name) <= ceiling:
                raise SettingsError(f"{env_name(name)} must be between {floor} and {ceiling:,}")
        choices = {
            "rerank_backend": ("torch", "int8"),
            "packed": ("auto", "on", "off"),
            "varlen_attention": ("auto", "flash-attn", "torch", "sdpa"),
            "batching": BATCHINGS,
            "dtype": ("auto", "float32", "float16", "bfloat16"),
            "log_format": LOG_FORMATS,
            "log_level": LOG_LEVELS,
            "sparse": SPARSE_KINDS,
            "retrieval": RETRIEVALS,
            "fusion": FUSIONS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise SettingsError(f"{env_name(name)} must be one of {', '.join(allowed)}")
        for name, low, high in (
            ("rerank_min_agreement", -1.0, 1.0),
            ("vacuum_deleted_ratio", 0.0, 1.0),
            ("rrf_dense_weight", 0.01, 100.0),
            ("rrf_sparse_weight", 0.01, 100.0),
            ("port", 1, 65535),
        ):
            if not low <= getattr(self, name) <= high:
                raise SettingsError(f"{env_name(name)} must be between {low:g} and {high:g}")

    @property
    def host_threads(self) -> int:
        """Threads of the host pool: the setting, or one per core but one (at least 1)."""
        if self.tokenizer_threads:
            return self.tokenizer_threads
        affinity = getattr(os, "sched_getaffinity", None)
        cores = len(affinity(0)) if affinity else (os.cpu_count() or 1)
        return max(1, cores - 1)

    @property
    def watch_folders(self) -> tuple[Path, ...]:
        return tuple(Path(f.strip()).expanduser() for f in self.watch.split(",") if f.strip())

    @property
    def metadata_index_keys(self) -> tuple[str, ...]:
        return tuple(key.strip() for key in self.metadata_indexes.split(",") if key.strip())

    @property
    def uses_embedded_qdrant(self) -> bool:
        return self.qdrant_url is None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read `RAGRANK_*` variables; keyword overrides (CLI flags) win, `None` ones are ignored.

        `RAGRANK_PRESET` (or the `preset` override) picks a model pair from `PRESETS`; an explicit
        model variable or flag still wins over the preset.
        """
        environ = os.environ if environ is None else environ
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        preset = overrides.pop("preset", None) or environ.get(ENV_PREFIX + "PRESET")
        if preset:
            if preset not in PRESETS:
                raise SettingsError(
                    f"{ENV_PREFIX}PRESET must be one of {', '.join(PRESETS)}, got {preset!r}"
                )
            values["embed_model"], values["rerank_model"] = PRESETS[preset]
        for f in dataclasses.fields(cls):
            raw = environ.get(env_name(f.name))
            if raw is not None:
                keep_empty = f.metadata.get("empty_is_value", False)
                values[f.name] = raw if keep_empty else _convert(f.name, raw, hints[f.name])
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def settings_table() -> list[tuple[str, str]]:
    """(variable, default) pairs, for docs and for checks that a variable name is real."""
    return [
        (env_name(f.name), "" if f.default is None else str(f.default))
        for f in dataclasses.fields(Settings)
    ]


def _convert(name: str, raw: str, kind: Any) -> Any:
    args = set(typing.get_args(kind))
    optional = type(None) in args
    base = next(iter(args - {type(None)}), kind) if args else kind
    if optional and raw == "":
        return None
    try:
        if base is int:
            return int(raw)
        if base is float:
            return float(raw)
        if base is Path:
            return Path(raw).expanduser()
        return raw
    except ValueError:
        kind_name = "a number" if base is float else "an integer"
        raise SettingsError(f"{env_name(name)} must be {kind_name}, got {raw!r}") from None
