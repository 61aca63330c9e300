"""One frozen settings object, built from `RAGRANK_*` environment variables and CLI flags."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ragrank.errors import SettingsError
from ragrank.fieldspec import option
from ragrank.ids import collection_problem
from ragrank.language import Bm25Language  # noqa: TC001 (`get_type_hints` reads it)

if typing.TYPE_CHECKING:
    from collections.abc import Mapping

ENV_PREFIX = "RAGRANK_"

# The choices of each enumerated setting, once: the field's type, and the tuple other modules
# read (the batching engine, the packed forward, the device, the eval's options).
#: The batching policies of `ragrank/engine/scheduling.py`.
Batching = Literal["continuous", "window", "arrival", "request"]
#: `auto` writes JSON lines unless stderr is a terminal (see `ragrank/logs.py`).
LogFormat = Literal["auto", "json", "text"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
#: The sparse (BM25) tokenisers of `ragrank/sparse.py`, and `none` for dense vectors only.
SparseKind = Literal["bm25", "subword", "none"]
#: What the first stage retrieves with, and how hybrid retrieval fuses its two lists.
Retrieval = Literal["dense", "sparse", "hybrid"]
FusionKind = Literal["rrf", "dbsf"]
#: The floating-point type of the models' forward passes.
Dtype = Literal["auto", "float32", "float16", "bfloat16"]
#: How packed attention runs (`ragrank/backends/packing.py`).
VarlenAttention = Literal["auto", "flash-attn", "torch", "sdpa"]
Packed = Literal["auto", "on", "off"]
#: The OpenVINO backends of the CPU (`ragrank/backends/openvino.py`): float32, and NNCF's
#: static int8.
OpenVinoBackend = Literal["openvino", "openvino-int8"]
#: How a model runs: as loaded, or compiled by OpenVINO; `auto` picks by preset and device
#: (`PRESET_CPU_BACKENDS`).
Backend = Literal["auto", "torch", OpenVinoBackend]
#: Backends that were removed, and what replaces each.
REMOVED_BACKENDS = {"int8": "openvino-int8"}
#: Where OpenVINO conversions are kept between starts.
OPENVINO_CACHE = Path("~/.cache/ragrank/openvino")
Switch = Literal["on", "off"]
#: How a request's `model` is matched against the served models' names.
ModelNames = Literal["open", "strict"]

RETRIEVALS: tuple[Retrieval, ...] = typing.get_args(Retrieval)
FUSIONS: tuple[FusionKind, ...] = typing.get_args(FusionKind)
DTYPES: tuple[Dtype, ...] = typing.get_args(Dtype)
VARLEN_BACKENDS: tuple[VarlenAttention, ...] = typing.get_args(VarlenAttention)
#: The structural limits of any JSON body, and the route limits each must hold.
BODY_LIMITS_HOLD = {
    "max_json_items": ("max_rerank_documents", "max_embed_inputs", "max_ingest_documents"),
    "max_json_string_chars": (
        "max_query_chars",
        "max_document_chars",
        "max_ingest_document_chars",
    ),
}

DEFAULT_EMBED_MODEL = "intfloat/multilingual-e5-base"
DEFAULT_RERANK_MODEL = "BAAI/bge-reranker-v2-m3"

#: Model presets. `small` suits machines without a GPU; `default` is the production pair.
Preset = Literal["default", "small"]
PRESETS: dict[Preset, tuple[str, str]] = {
    "default": (DEFAULT_EMBED_MODEL, DEFAULT_RERANK_MODEL),
    "small": ("intfloat/multilingual-e5-small", "cross-encoder/mmarco-mMiniLMv2-L12-H384-v1"),
}
#: (embedder, reranker) backends that `auto` picks on a CPU for a preset's models; `torch`
#: everywhere else. Chosen by measurement: docs/performance.md#cpu-backends.
PRESET_CPU_BACKENDS: dict[Preset, tuple[Backend, Backend]] = {
    "small": ("openvino", "openvino"),
}


#: "e5" between the start or end of a name and a hyphen, underscore or dot.
E5_NAME = re.compile(r"(?:^|[-_.])e5(?:[-_.]|$)")


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
    # "e5" as a word of the id or of a folder's name ("intfloat/multilingual-e5-small"), not
    # any "e5" in a path: a checkout under "clone5" holds no e5 model.
    if any(E5_NAME.search(part) for part in Path(embed_model.lower()).parts):
        return "query: ", "passage: "
    return "", ""


def choices_of(kind: Any) -> tuple[Any, ...]:
    """The values a `Literal` type (or an optional one) allows; empty for other types."""
    if typing.get_origin(kind) is Literal:
        return typing.get_args(kind)
    for arg in typing.get_args(kind):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return ()


def bounds(f: dataclasses.Field[Any]) -> tuple[float | None, float | None]:
    """The (least, most) a settings field allows; None where unbounded."""
    return f.metadata.get("ge"), f.metadata.get("le")


def range_text(low: float | None, high: float | None) -> str:
    """A range as the messages and the reference say it: `between 1 and 20,000`."""

    def number(value: float) -> str:
        return f"{value:,}" if float(value).is_integer() and abs(value) >= 1000 else f"{value:g}"

    if low is not None and high is not None:
        return f"between {number(low)} and {number(high)}"
    if low is not None:
        return "0 or more" if low == 0 else f"at least {number(low)}"
    return f"at most {number(high)}" if high is not None else ""


def shown_default(f: dataclasses.Field[Any]) -> str:
    """The default of a settings field as the configuration reference shows it."""
    if f.metadata.get("shown"):
        return str(f.metadata["shown"])
    if f.default is None:
        return "none"
    if f.default == "":
        return "empty"
    return f"`{f.default}`"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every knob of ragrank. Each field `name` is read from the variable `RAGRANK_<NAME>`."""

    preset: Preset | None = option(
        None,
        "a model pair for both model settings left at their defaults: "
        + ", ".join(f"`{name}` = {embed} + {rerank}" for name, (embed, rerank) in PRESETS.items())
        + " (`ragrank demo` without one picks `default` with CUDA, else `small`)",
        group="models",
    )
    embed_model: str = option(
        DEFAULT_EMBED_MODEL, "bi-encoder: hub id or local folder", group="models"
    )
    rerank_model: str = option(
        DEFAULT_RERANK_MODEL, "one-logit cross-encoder: hub id or local folder", group="models"
    )
    embed_models: str = option(
        "",
        "several embedders in one server, for the embeddings routes: comma-separated "
        "`name=model` entries (`name1|name2=model` gives one model several names; `*` as a "
        "name takes any name no other model has); the first is the default, indexes and "
        "answers searches, and overrides `RAGRANK_EMBED_MODEL` (see "
        "[models](models.md#several-models-in-one-server))",
    )
    rerank_models: str = option(
        "",
        "several rerankers in one server, each picked by a request's `model`: entries as for "
        "`RAGRANK_EMBED_MODELS`; the first is the default and overrides `RAGRANK_RERANK_MODEL`",
    )
    cascade: str = option(
        "",
        "`NAME:K`: searches rerank as a cascade, the served reranker `NAME` (a fast one, e.g. a "
        "distilled student) scoring every candidate and the default reranker rescoring only "
        "its top K; empty: off. A request's `cascade` overrides it (see "
        "[models](models.md#a-cascade-of-two-rerankers))",
        group="models",
    )
    rerank_blend: float = option(
        0.0,
        "the first stage's weight in a reranked search's order, 0 to 1: each hit ranks by "
        "`w/(60 + its first-stage rank) + (1 - w)/(60 + its reranker rank)`; `0`: the "
        "reranker's order alone. Scores stay the reranker's (see "
        "[models](models.md#blending-the-reranker-with-the-first-stage))",
        ge=0.0,
        le=1.0,
        group="models",
    )
    models_file: Path | None = option(
        None,
        "a TOML file with one `[[models]]` table per served model (`name`, `role`, `model`, and "
        "optionally `backend`, `dtype`, `device`, `max_batch_tokens`, `max_batch_size`, "
        "`packed`, `query_prefix`, `passage_prefix`, `max_length`): each model configured on "
        "its own; what a table leaves out comes from its role's variables (see "
        "[models](models.md#a-models-file))",
    )
    model_names: ModelNames = option(
        "open",
        "`open`: a request's `model` that no served model answers to gets its role's default, so "
        "clients that send a vendor's name (`rerank-v3.5`, `text-embedding-3-small`) work "
        "unchanged; `strict`: such a name is a `400` listing the served names, and the OpenAPI "
        "schema lists them as each `model` field's `enum` (see "
        "[models](models.md#several-models-in-one-server))",
    )
    model_memory_share: float = option(
        0.8,
        "share of the device's free memory the served models' weights may take at start-up; "
        "a set that needs more is refused, with the figures (the rest is left to the batches)",
        ge=0.01,
        le=1.0,
    )
    query_prefix: str | None = option(
        None,
        "prepended to queries before embedding; set it empty for none",
        shown="`query: ` for e5 models, else empty",
        empty_is_value=True,
    )
    passage_prefix: str | None = option(
        None,
        "prepended to chunks before embedding",
        shown="`passage: ` for e5 models, else empty",
        empty_is_value=True,
    )

    qdrant_path: Path = option(
        Path("ragrank-data/qdrant"),
        "the embedded store's folder (Qdrant Edge), used unless `RAGRANK_QDRANT_URL` is set",
        group="models",
    )
    qdrant_url: str | None = option(
        None, "a Qdrant server, e.g. `http://localhost:6333` or a Qdrant Cloud URL", group="models"
    )
    qdrant_api_key: str | None = option(None, "the server's API key", secret=True)
    collection: str = option(
        "ragrank",
        "collection name; created (cosine, the model's dimension) if missing",
        shown="`ragrank` (`ragrank-demo` for the demo)",
        group="models",
    )
    qdrant_shard_number: int = option(
        1,
        "shards of a collection ragrank creates on a Qdrant server (cluster mode); an existing "
        "collection keeps its own",
        ge=1,
    )
    qdrant_replication_factor: int = option(
        1, "copies of each shard across the cluster's nodes", ge=1
    )
    qdrant_write_consistency_factor: int = option(
        1, "copies a write waits for (at most the replication factor)", ge=1
    )
    hnsw_m: int = option(16, "edges per node of the HNSW graph of a new collection", ge=1)
    hnsw_ef_construct: int = option(100, "candidates considered while building the graph", ge=1)
    hnsw_ef: int = option(
        128,
        "candidates each search explores in the graph (see [the "
        "store](deployment.md#the-store-qdrant-edge-embedded-a-qdrant-server-at-scale))",
        ge=1,
    )
    hnsw_indexing_threshold_kb: int = option(
        10_000,
        "KiB of vectors from which a segment gets a graph; smaller ones are scanned exactly",
        ge=1,
    )
    vacuum_deleted_ratio: float = option(
        0.0,
        "share of a segment's points deleted or overwritten from which an index build rebuilds it"
        " without them; `0` rebuilds any segment with a deletion, which keeps BM25's IDF exact "
        "(see [hybrid retrieval](retrieval.md))",
        ge=0.0,
        le=1.0,
    )
    sparse: SparseKind = option(
        "bm25",
        "the BM25 sparse vector stored beside the dense one: `bm25` (Qdrant's BM25, a "
        "multilingual word tokenizer), `subword` (the embedding model's tokenizer) or `none` "
        "(dense only); with the `RAGRANK_BM25_*` settings, part of each document's stamp: a "
        "change re-indexes",
    )
    bm25_language: Bm25Language = option(
        "auto",
        "stopwords and Snowball stemmer of `bm25`: `auto` analyses each chunk and query in its "
        "own language (a document's `lang` or `language` metadata, else identified from the "
        "text), a language name (e.g. `german`) analyses everything as that one, `none` uses "
        "neither (see [multilingual BM25](retrieval.md#every-language-its-own-bm25))",
    )
    bm25_query_confidence: float = option(
        0.5,
        "with `auto`, the probability a query's likeliest language needs for its words to be "
        "analysed as that language alone; below it, as both of the two likeliest",
        ge=0.0,
        le=1.0,
    )
    bm25_k: float = option(
        1.2, "BM25's term-frequency saturation (`0`: a term counts once)", ge=0.0, le=100.0
    )
    bm25_b: float = option(0.75, "BM25's length normalisation", ge=0.0, le=1.0)
    bm25_avg_len: float = option(
        256.0,
        "the chunk length, in terms, that length normalisation is relative to",
        ge=1.0,
        le=1_000_000.0,
    )
    retrieval: Retrieval = option(
        "hybrid",
        "a search's first stage when the request does not say: `dense`, `sparse` or `hybrid`",
    )
    fusion: FusionKind = option(
        "dbsf",
        "how `hybrid` fuses its lists when the request does not say: `rrf` or `dbsf`",
    )
    rrf_k: int = option(2, "RRF's k when the request does not say", ge=1)
    rrf_dense_weight: float = option(
        1.0,
        "RRF's weight of the dense list when the request does not say (Qdrant divides a list's "
        "1-based positions by its weight)",
        ge=0.01,
        le=100.0,
    )
    rrf_sparse_weight: float = option(
        1.0, "RRF's weight of the BM25 list when the request does not say", ge=0.01, le=100.0
    )
    fusion_other_languages: float = option(
        0.6,
        "with `auto` BM25, how much of BM25's part of a `hybrid` score a passage in another "
        "language than the query's (which BM25 cannot match) takes from the dense list instead: "
        "`0` fuses as Qdrant does, `1` ranks such passages by the dense list alone",
        ge=0.0,
        le=1.0,
    )

    device: str = option(
        "auto", "`auto` (CUDA when present, else CPU), `cpu`, `cuda`, `cuda:N`", group="models"
    )
    dtype: Dtype = option(
        "auto",
        "`auto` (bf16 on CUDA, fp16 on GPUs without bf16, fp32 on CPU), `float32`, `float16`, "
        "`bfloat16`; logits and embeddings are always read in fp32",
    )
    embed_batch_size: int = option(
        0, "most texts in one embedding forward pass", shown="`0` = 16 on CPU, 256 on CUDA", ge=0
    )
    embed_batch_tokens: int = option(
        0,
        "most tokens in one embedding forward pass: padded ones, or real ones when packed",
        shown="`0` = 8,192 on CPU, 32,768 on CUDA",
        ge=0,
    )
    rerank_batch_size: int = option(
        0,
        "most pairs in one cross-encoder forward pass",
        shown="`0` = 16 on CPU, 256 on CUDA",
        ge=0,
    )
    rerank_batch_tokens: int = option(
        0,
        "most tokens in one cross-encoder forward pass: padded ones, or real ones when packed",
        shown="`0` = 8,192 on CPU, 32,768 on CUDA",
        ge=0,
    )
    rerank_max_length: int = option(
        0,
        "tokens per (query, document window) input; a longer document is scored in windows. "
        "Never past the model's own limit",
        shown="`0` = 512 for BERT and XLM-R rerankers, the model's own limit up to 8,192 for "
        "ModernBERT and Qwen3 rerankers (see [models](models.md))",
        ge=0,
    )
    rerank_instruction: str = option(
        "",
        "the task a Qwen3 reranker is told in its prompt, when its folder's chat template does not "
        "set the prompt itself",
        shown="empty = the model card's: `Given a web search query, retrieve relevant passages "
        "that answer the query`",
    )
    rerank_backend: Backend = option(
        "auto",
        "`torch` runs the reranker as loaded; `openvino` compiles it with OpenVINO for the CPU "
        "(float32, same scores); `openvino-int8` also quantises it with NNCF. Both run on the "
        "CPU only and are checked against torch at start-up. `auto`: `openvino` on a CPU "
        "with the `small` preset, else `torch` (see [performance](performance.md#cpu-backends))",
    )
    rerank_min_agreement: float = option(
        0.9,
        "least mean per-query Spearman correlation between the backend's and torch's float32 "
        "scores on the calibration set; below it the reranker is refused",
        ge=-1.0,
        le=1.0,
    )
    embed_backend: Backend = option(
        "auto",
        "`torch` runs the embedder as loaded; `openvino` compiles it with OpenVINO for the CPU "
        "(float32, same vectors); `openvino-int8` also quantises it with NNCF. Both run on the "
        "CPU only, are checked against torch at start-up, and are part of each document's "
        "stamp, so a change re-embeds. `auto`: `openvino` on a CPU with the `small` preset, "
        "else `torch` (see [performance](performance.md#cpu-backends))",
    )
    embed_min_agreement: float = option(
        0.99,
        "least mean cosine between the backend's and torch's float32 vectors of the "
        "calibration texts; below it the embedder is refused",
        ge=-1.0,
        le=1.0,
    )
    openvino_cache: Path = option(
        OPENVINO_CACHE,
        "where the OpenVINO backends keep their converted models, one folder per model, "
        "recipe and OpenVINO version, so that a restart does not convert again",
    )
    packed: Packed = option(
        "auto",
        "`on`: each batch's sequences are packed into one row without padding and attention runs "
        "per sequence (varlen), for BERT and XLM-R models; `off`: padded batches; `auto`: packed "
        "on CUDA, padded on CPU (measured faster there, see [performance](performance.md)). "
        "Other architectures fall back to padded batches, logged once",
    )
    varlen_attention: VarlenAttention = option(
        "auto",
        "the packed path's attention: `flash-attn` (`flash_attn_varlen_func`, when installed), "
        "`torch` (PyTorch's varlen kernel, CUDA, fp16/bf16), `sdpa` (one SDPA call per sequence, "
        "any device); `auto` picks in that order",
    )
    cpu_kernel_cache: int = option(
        0,
        "compiled CPU kernels oneDNN keeps, one per batch shape (its "
        "`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, which wins when set): a server sees thousands of "
        "shapes, and at oneDNN's 1,024 its memory climbs for tens of minutes (see "
        "[the soak run](performance.md#soak-make-soak))",
        ge=0,
    )
    tokenizer_threads: int = option(
        0,
        "host threads that tokenise, plan windows and collate batches, each with its own "
        "tokenizer copy",
        shown="`0` = cores − 1, at least 1",
        ge=0,
    )
    batching: Batching = option(
        "continuous",
        "`continuous`: each batch is formed as the device frees up, from the oldest waiting "
        "requests, so requests finish as their own batches do; `window`: everything waiting, "
        "sorted longest first across requests and answered when the window's last batch ends; "
        "`arrival`: a window in arrival order; `request`: no sharing across requests (the last "
        "three are baselines for the benchmarks)",
    )
    warmup: Switch = option(
        "on",
        "run each served model over representative shapes before `/ready` turns 200, so the "
        "first request does not pay for the device's start (kernels, allocator)",
    )
    batch_wait_ms: int = option(
        5,
        "how long an idle window policy waits for concurrent requests to join its batches "
        "(`continuous` starts at once: what arrives meanwhile joins the next batch)",
        ge=0,
    )
    queue_size: int = option(4096, "items waiting per model before new requests get `429`", ge=1)
    bulk_batch_share: float = option(
        0.25,
        "the share of a model's batch token budget that one indexing batch may take: indexing "
        "yields to requests between batches, so this bounds what a search waits behind "
        "indexing (see [performance](performance.md#search-while-indexing))",
        ge=0.01,
        le=1.0,
    )
    request_timeout_s: int = option(60, "longest a request waits for a model; then `504`", ge=1)

    chunk_tokens: int = option(
        256, "tokens per chunk, prefix included, capped by the model's limit", ge=1, group="index"
    )
    chunk_overlap: int = option(32, "tokens shared by neighbouring chunks", ge=0, group="index")
    index_batch_size: int = option(
        64, "chunks embedded and upserted per batch", ge=1, group="index", flag="--batch-size"
    )
    metadata_indexes: str = option(
        "", "comma-separated metadata keys to give payload indexes on a Qdrant server"
    )
    jobs_path: Path = option(
        Path("ragrank-data/jobs.sqlite3"),
        "the durable job queue (SQLite) that the API writes and its one worker reads, on one "
        "machine; unused when `RAGRANK_JOBS_URL` is set",
        group="worker",
    )
    jobs_url: str | None = option(
        None,
        "a PostgreSQL URL (`postgresql://user:password@host:5432/db`) for a job queue shared by "
        "any number of API replicas and workers on any hosts; its tables are created and "
        "migrated on first use",
        group="worker",
        secret=True,
    )
    jobs_lease_s: int = option(
        30,
        "seconds a worker's claim on a job lasts (PostgreSQL queue); the worker renews it every "
        "third of that, and a job whose worker died runs again once it ran out",
        ge=3,
    )
    jobs_max_lost: int = option(
        3,
        "times a job may lose its worker (killed, or cut off for longer than the lease) and be "
        "taken over; the next loss ends it `failed` (PostgreSQL queue)",
        ge=0,
    )
    watch: str = option(
        "",
        "comma-separated folders the worker keeps in sync (new, changed and deleted files)",
        group="worker",
    )
    watch_interval_s: int = option(30, "seconds between two sweeps of the watched folders", ge=1)

    max_request_bytes: int = option(
        16 * 1024 * 1024,
        "the largest request body read; a larger one gets `413` naming this limit, unread",
        shown="`16777216` (16 MiB)",
        ge=1,
    )
    # A document with metadata nests four levels deep: body, `documents`, the document, `metadata`.
    max_json_depth: int = option(
        32, "levels of nesting of a JSON body, its arrays and objects", ge=4, le=256
    )
    max_json_values: int = option(
        500_000,
        "array items and object members in a whole JSON body",
        ge=1,
        le=10_000_000,
    )
    max_json_items: int = option(
        20_480,
        "items of any one array in a JSON body; at least each route's own item limit",
        ge=1,
        le=100_000,
    )
    # A search request has 11 fields.
    max_json_keys: int = option(256, "members of any one object in a JSON body", ge=16, le=10_000)
    max_json_string_chars: int = option(
        1_000_000,
        "characters of any one string or key in a JSON body; at least each route's own "
        "character limit",
        ge=1,
        le=10_000_000,
    )
    max_query_chars: int = option(2_000, "characters of a search or rerank query", ge=1, le=20_000)
    # A request that leaves out top_k or candidates gets their defaults, 10 and 50.
    max_top_k: int = option(100, "most results of a search", ge=10, le=1_000)
    max_candidates: int = option(500, "most chunks a search retrieves to rerank", ge=50, le=5_000)
    max_rerank_documents: int = option(
        1_000,
        "documents in one `/v1/rerank` or `/rerank` request",
        ge=1,
        le=10_000,
    )
    max_document_chars: int = option(
        100_000,
        "characters of one document to rerank or text to embed",
        ge=1,
        le=1_000_000,
    )
    max_embed_inputs: int = option(
        2_048,
        "texts in one embeddings request, on any of its routes",
        ge=1,
        le=20_480,
    )
    max_ingest_documents: int = option(
        1_000, "documents in one `POST /v1/documents`", ge=1, le=10_000
    )
    max_ingest_document_chars: int = option(
        1_000_000, "characters of one ingested document", ge=1, le=10_000_000
    )

    api_keys: str = option(
        "",
        "comma-separated API keys with full access; with any key set, every route but `/health` "
        "and `/ready` needs one",
        secret=True,
    )
    readonly_api_keys: str = option(
        "",
        "comma-separated keys that may search, rerank and embed but not write documents",
        secret=True,
    )
    api_keys_file: Path | None = option(
        None, "a file of full-access keys, one per line (`#` comments), e.g. a Docker secret"
    )
    readonly_api_keys_file: Path | None = option(None, "the same for read-only keys")

    log_format: LogFormat = option(
        "auto", "`json` (one object per line), `text`, or `auto`: JSON unless stderr is a terminal"
    )
    log_level: LogLevel = option("INFO", "`DEBUG`, `INFO`, `WARNING` or `ERROR`")

    host: str = option(
        "127.0.0.1",
        "interface `ragrank serve` listens on (`0.0.0.0` in containers)",
        group="listen",
    )
    port: int = option(8000, "port `ragrank serve` listens on", ge=1, le=65535, group="listen")
    playground: Switch = option(
        "on", "serve the web [playground](playground.md) at `/playground`: `on` or `off`"
    )
    labels: Path | None = option(
        None,
        "a BEIR folder (`queries.jsonl`, `qrels/test.tsv`) whose labelled queries the playground "
        "offers as examples and marks, with NDCG@10; `ragrank demo` sets the bundled sample's",
    )

    def __post_init__(self) -> None:
        # An empty variable (as compose files pass them) means "not set".
        for name in ("qdrant_url", "qdrant_api_key", "jobs_url"):
            if getattr(self, name) == "":
                object.__setattr__(self, name, None)
        # A preset fills the model settings nobody set; a list of served models names the
        # default first, and the single-model fields follow it.
        if self.preset in PRESETS:
            for name, model in zip(
                ("embed_model", "rerank_model"), PRESETS[self.preset], strict=True
            ):
                if getattr(self, name) == _DEFAULTS[name]:
                    object.__setattr__(self, name, model)
        for single, listed in (("embed_model", "embed_models"), ("rerank_model", "rerank_models")):
            served = parse_served(getattr(self, listed), env_name(listed))
            if served:
                object.__setattr__(self, single, served[0].model_id)
        self._check_values()
        if self.sparse == "none" and self.retrieval != "dense":
            raise SettingsError(
                f"{env_name('retrieval')}={self.retrieval} needs sparse vectors, but "
                f"{env_name('sparse')}=none; set {env_name('retrieval')}=dense"
            )

    def _check_values(self) -> None:
        """Each field within its declared choices and range, then the rules across fields."""
        hints = _hints()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_backend") and value in REMOVED_BACKENDS:
                raise SettingsError(
                    f"{env_name(f.name)}={value}, ragrank's own int8 recipe, was removed: "
                    f"{REMOVED_BACKENDS[value]} is faster and closer to float32 (see "
                    f"docs/decisions.md); set {env_name(f.name)}={REMOVED_BACKENDS[value]}"
                )
            allowed = choices_of(hints[f.name])
            if allowed and value is not None and value not in allowed:
                raise SettingsError(f"{env_name(f.name)} must be one of {', '.join(allowed)}")
            low, high = bounds(f)
            if value is not None and not (
                (low is None or value >= low) and (high is None or value <= high)
            ):
                raise SettingsError(f"{env_name(f.name)} must be {range_text(low, high)}")
        if self.chunk_overlap >= self.chunk_tokens:
            raise SettingsError(
                f"{env_name('chunk_overlap')} must be >= 0 and below {env_name('chunk_tokens')}"
            )
        if self.qdrant_write_consistency_factor > self.qdrant_replication_factor:
            raise SettingsError(
                f"{env_name('qdrant_write_consistency_factor')} cannot exceed "
                f"{env_name('qdrant_replication_factor')}: a write cannot wait for more copies "
                f"than exist"
            )
        for name, held in BODY_LIMITS_HOLD.items():
            for route_limit in held:
                if getattr(self, route_limit) > getattr(self, name):
                    raise SettingsError(
                        f"{env_name(route_limit)}={getattr(self, route_limit)} is above "
                        f"{env_name(name)}={getattr(self, name)}, which bounds every JSON body "
                        f"first: raise {env_name(name)} too"
                    )
        if self.jobs_url and not self.jobs_url.startswith(("postgresql://", "postgres://")):
            raise SettingsError(
                f"{env_name('jobs_url')} must be a PostgreSQL URL: postgresql://user:password@"
                f"host:5432/database"
            )
        from ragrank.cascade import Cascade

        Cascade.parse(self.cascade, env_name("cascade"))
        problem = collection_problem(self.collection)
        if problem:
            raise SettingsError(f"{env_name('collection')}: {problem}")

    def prefixes(self, model_id: str | None = None) -> tuple[str, str]:
        """The (query, passage) prefixes of the embedder `model_id` (default: the default one).
        The prefix settings apply to the default embedder; any other prefix is the model's own
        (`default_prefixes`). Resolved when asked, so building or `replace()`-ing settings reads
        no model files."""
        model = model_id or self.embed_model
        query, passage = (
            (self.query_prefix, self.passage_prefix) if model == self.embed_model else (None, None)
        )
        if query is None or passage is None:
            own_query, own_passage = default_prefixes(model)
            query = own_query if query is None else query
            passage = own_passage if passage is None else passage
        return query, passage

    @property
    def host_threads(self) -> int:
        """Threads of the host pool: the setting, or one per core but one (at least 1)."""
        if self.tokenizer_threads:
            return self.tokenizer_threads
        affinity = getattr(os, "sched_getaffinity", None)
        cores = len(affinity(0)) if affinity else (os.cpu_count() or 1)
        return max(1, cores - 1)

    @property
    def served_embedders(self) -> tuple[ServedModel, ...]:
        """The embedders to serve, the default first."""
        listed = parse_served(self.embed_models, env_name("embed_models"))
        return listed or (ServedModel((self.embed_model,), self.embed_model),)

    @property
    def served_rerankers(self) -> tuple[ServedModel, ...]:
        """The rerankers to serve, the default first."""
        listed = parse_served(self.rerank_models, env_name("rerank_models"))
        return listed or (ServedModel((self.rerank_model,), self.rerank_model),)

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
        """Read `RAGRANK_*` variables; keyword overrides (CLI flags) win, `None` ones are
        ignored."""
        environ = os.environ if environ is None else environ
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
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


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(Settings)


#: The declared defaults of the two model settings a preset fills.
_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(Settings)
    if f.name in ("embed_model", "rerank_model")
}


#: The request limits (the `max_*` settings the OpenAPI schema states) and the most and the
#: least each may be set to, read off their fields: the schema's hard bounds. A floor above 1
#: says why 1 is not enough in the field's own declaration.
_LIMITS = [
    f
    for f in dataclasses.fields(Settings)
    if f.name.startswith("max_") and f.metadata.get("le") is not None
]
LIMIT_CEILINGS: dict[str, int] = {f.name: int(f.metadata["le"]) for f in _LIMITS}
LIMIT_FLOORS: dict[str, int] = {f.name: int(f.metadata["ge"]) for f in _LIMITS}


#: The name that picks a model for any name no other served model answers to.
ANY_NAME = "*"


@dataclass(frozen=True)
class ServedModel:
    """One model of a list of served ones: the names a request's `model` may give it, and the
    hub id or folder it loads from."""

    names: tuple[str, ...]
    model_id: str

    @property
    def name(self) -> str:
        """The model's first name: what `/v1/models` and the metrics call it."""
        return first_name(self.names)


def first_name(names: tuple[str, ...]) -> str:
    """The first of a served model's names that is not the catch-all (it always has one: its
    model id)."""
    return next((n for n in names if n != ANY_NAME), names[0])


def parse_served(listed: str, variable: str) -> tuple[ServedModel, ...]:
    """`name=model, name1|name2=model, model` into served models; a `SettingsError` naming
    `variable` for an empty entry, or a name given twice."""
    served: list[ServedModel] = []
    seen: set[str] = set()
    for entry in (e.strip() for e in listed.split(",")):
        if not entry:
            if listed.strip():
                raise SettingsError(f"{variable} has an empty entry: {listed!r}")
            continue
        names_part, equals, model_id = entry.rpartition("=")
        model_id = model_id.strip()
        names = tuple(n.strip() for n in names_part.split("|")) if equals else ()
        if not model_id or any(not n for n in names):
            raise SettingsError(
                f"{variable}: {entry!r} is not `name=model`, `name1|name2=model` or `model`"
            )
        names = (*names, model_id) if model_id not in names else names
        for name in names:
            if name in seen:
                raise SettingsError(f"{variable}: the name {name!r} is given to two models")
            seen.add(name)
        served.append(ServedModel(names, model_id))
    return tuple(served)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def settings_table() -> list[tuple[str, str]]:
    """(variable, default) pairs, for docs and for checks that a variable name is real."""
    return [
        (env_name(f.name), "" if f.default is None else str(f.default))
        for f in dataclasses.fields(Settings)
    ]


def _convert(name: str, raw: str, kind: Any) -> Any:
    if choices_of(kind):
        return raw  # checked against the choices with every other value
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
