"""`make bench-gpu`: the scoring pipeline on one GPU, with random models of the production shapes.

Builds random-weight models shaped like bge-reranker-v2-m3 and multilingual-e5-base (real
configs and the real XLM-R tokenizer from `../shared/models`, or RAGRANK_SHARED_DIR's `models`),
then reports in one run:

* the GPU's measured bf16 matmul peak (TFLOP/s);
* reranker pairs/s, model only, at 128, 256 and 512 tokens and at SciFact lengths (each query
  against 100 abstracts, windowed as the server windows them), packed vs padded, and the share
  of the measured peak each reaches; packed under several token budgets and varlen kernels;
* `/v1/rerank` on a real `ragrank serve` at 16 and 64 clients x 32 abstracts, against the model
  alone at the same lengths;
* embedder passages/s (SciFact abstracts), packed vs padded;
* how often the packed bf16 top-10 of a query equals the fp32 padded top-10, on a reranker of
  the same shape whose logits are spread wide enough for rank agreement to mean something;
* pairs/s of one reranker of each family (MiniLM-L6, bge-reranker-v2-m3, ModernBERT-base and
  Qwen3-Reranker-0.6B shapes) on the same SciFact pairs (`eval.bench.families`).

Random weights: the figures are speed and numerics only, never relevance. `--tiny` swaps in
two-layer models of the same families so the whole run can be checked on a CPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from eval.bench.families import build_family_models, family_rates, print_rates
from eval.bench.harness import (
    RunResult,
    Workload,
    drive,
    first_request_ms,
    free_port,
    ragrank_command,
    server_process,
)
from eval.bench.options import SHARED_DIR, XLMR_TOKENIZER, GpuOptions, bench_data
from eval.bench.rates import forward_rate, scifact_requests, timed
from eval.random_models import SPREAD_INIT
from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.beir import load_beir
from ragrank.device import Placement, resolve_placement
from ragrank.options import parse_options
from ragrank.settings import VARLEN_BACKENDS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ragrank.tokens import ModelInput

console = Console()

RERANKER_CONFIG = SHARED_DIR / "models" / "bge-reranker-v2-m3"
EMBEDDER_CONFIG = SHARED_DIR / "models" / "multilingual-e5-base"
TOKEN_BUDGETS = (16_384, 32_768, 65_536)


@dataclass(frozen=True)
class BenchModels:
    """The random models one run uses, each a folder."""

    reranker: Path
    embedder: Path
    #: The reranker's shape with widely spread logits, for the bf16 top-10 agreement.
    spread: Path

    @classmethod
    def at(cls, folder: Path) -> BenchModels:
        return cls(folder / "reranker", folder / "embedder", folder / "reranker-spread")


def build_models(out: Path, *, tiny: bool) -> BenchModels:
    """Random models of the two production shapes (or two-layer ones with `tiny`), and the
    reranker's shape again with spread logits."""
    from transformers import AutoConfig

    from eval.random_models import ModelKind, load_tokenizer, save_random_model

    models = BenchModels.at(out)
    plan: tuple[tuple[ModelKind, Path, Path, dict[str, float]], ...] = (
        ("reranker", RERANKER_CONFIG, models.reranker, {}),
        ("embedder", EMBEDDER_CONFIG, models.embedder, {}),
        ("reranker", RERANKER_CONFIG, models.spread, {"initializer_range": SPREAD_INIT}),
    )
    for kind, config_dir, folder, extra in plan:
        config = AutoConfig.from_pretrained(str(config_dir))
        config.update(extra)
        if tiny:
            config.update({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128})
            config.num_attention_heads = 4
        tokenizer = load_tokenizer(XLMR_TOKENIZER, out / f"{kind}-tok", 512)
        save_random_model(kind, config, tokenizer, folder)
    return models


def matmul_peak(device: str, dtype: torch.dtype, size: int, trials: int = 5) -> float:
    """Measured TFLOP/s of one large matmul, the ceiling the model's share is read against.

    The best of several trials: a peak read while something else held the device is too
    low, and every share read against it too high.
    """
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    seconds = min(timed(lambda: a @ b, device, repeat=20) for _ in range(trials))
    return 2 * size**3 / seconds / 1e12


def encoder_flops(config: Any, lengths: Sequence[int]) -> float:
    """FLOPs of the encoder layers over sequences of `lengths`: the matmuls (2 x weights x
    tokens) plus attention (4 x length^2 x hidden per layer)."""
    hidden, ffn = int(config.hidden_size), int(config.intermediate_size)
    layers = int(config.num_hidden_layers)
    weights = layers * (4 * hidden * hidden + 2 * hidden * ffn)
    tokens = sum(lengths)
    squares = sum(length * length for length in lengths)
    return 2.0 * weights * tokens + 4.0 * hidden * layers * squares


def synthetic_pairs(scorer: CrossEncoderScorer, length: int, count: int) -> list[ModelInput]:
    """`count` pairs of exactly `length` tokens: a 16-token query and a passage filling the rest."""
    rng = np.random.default_rng(length)
    passage = length - 16 - scorer.tokens.template.pair_specials
    return [
        scorer.tokens.pair(
            rng.integers(5, 250_000, 16).tolist(), rng.integers(5, 250_000, passage).tolist()
        )
        for _ in range(count)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_options(GpuOptions, argv, prog="python -m eval.bench.gpu", description=__doc__)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    placement = resolve_placement(args.device, args.dtype)
    device = placement.device
    data = bench_data(args.data)
    out = args.out or Path("eval-results") / time.strftime("bench-gpu-%Y%m%d-%H%M%S.json")
    report: dict[str, Any] = {"device": device, "dtype": str(placement.dtype), "data": str(data)}
    if device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name()
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(section: str, figures: Any) -> None:
        """Each section's figures are written as soon as they exist: a run cut short by its
        time limit still leaves what it measured."""
        report[section] = figures
        out.write_text(json.dumps(report, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="ragrank-bench-gpu-") as scratch:
        started = time.perf_counter()
        models = BenchModels.at(args.models) if args.models else None
        if models is None or not all(p.is_dir() for p in astuple(models)):
            models = build_models(args.models or Path(scratch), tiny=args.tiny)
            console.print(f"models built in {time.perf_counter() - started:.0f} s")
        size = 8192 if device.startswith("cuda") else 1024
        peak = matmul_peak(device, placement.dtype, size)
        # Three significant figures: a tiny matrix on a busy CPU measures well under 0.1.
        save("matmul_peak_tflops", float(f"{peak:.3g}"))
        console.print(f"measured {placement.dtype} matmul peak: {peak:.1f} TFLOP/s")
        save(
            "reranker",
            _reranker(
                models.reranker, placement=placement, data=data, args=args, peak=peak, report=report
            ),
        )
        save(
            "server",
            _server(
                models.reranker,
                embedder=models.embedder,
                device=device,
                data=data,
                args=args,
                report=report,
            ),
        )
        save("embedder", _embedder(models.embedder, placement, data, args))
        save(
            "agreement",
            {
                "spread": _agreement(models.spread, placement, data, args.queries),
                "default_init": _agreement(models.reranker, placement, data, args.queries),
            },
        )
        families = build_family_models((args.models or Path(scratch)) / "families", tiny=args.tiny)
        save(
            "families",
            family_rates(families, placement, scifact_requests(data, min(args.queries, 10), 100)),
        )
    _print(report)
    console.print(f"wrote {out}")
    return 0


def _reranker(
    folder: Path,
    *,
    placement: Placement,
    data: Path,
    args: GpuOptions,
    peak: float,
    report: dict[str, Any],
) -> dict[str, Any]:
    device = placement.device
    scorer = CrossEncoderScorer(str(folder), placement=placement, packed="on")
    config = scorer._runner.config
    rows: dict[str, Any] = {}
    workloads = {
        str(length): synthetic_pairs(scorer, length, args.pairs) for length in (128, 256, 512)
    }
    requests = scifact_requests(data, args.queries, 100)
    scifact: list[ModelInput] = []
    for query, docs in requests:
        scifact.extend(scorer.plan_windows(query, docs).inputs)
    workloads["scifact"] = scifact
    report["scifact_tokens_mean"] = round(float(np.mean([len(i) for i in scifact])), 1)
    for name, inputs in workloads.items():
        flops = encoder_flops(config, [len(i) for i in inputs]) / len(inputs)
        entry: dict[str, Any] = {}
        for packed in (True, False):
            rate = forward_rate(scorer, inputs, packed=packed, budget=32_768, device=device)
            entry["packed" if packed else "padded"] = {
                "pairs_per_s": round(rate, 1),
                "peak_share": round(rate * flops / (peak * 1e12), 3),
            }
        entry["packed_over_padded"] = round(
            entry["packed"]["pairs_per_s"] / entry["padded"]["pairs_per_s"], 2
        )
        rows[name] = entry
        console.print(f"reranker {name}: {entry}")
    budgets = {}
    for budget in TOKEN_BUDGETS:
        budgets[str(budget)] = round(
            forward_rate(scorer, scifact, packed=True, budget=budget, device=device), 1
        )
    rows["scifact_packed_by_budget"] = budgets
    kernels: dict[str, float | str] = {}
    for kernel in VARLEN_BACKENDS[1:]:
        if kernel != "sdpa" and not device.startswith("cuda"):
            continue
        scorer._runner.varlen = kernel
        try:
            kernels[kernel] = round(
                forward_rate(scorer, scifact, packed=True, budget=32_768, device=device), 1
            )
        except Exception as exc:  # a kernel missing on this machine is reported, not fatal
            kernels[kernel] = f"unavailable: {type(exc).__name__}: {str(exc)[:120]}"
    rows["scifact_packed_by_kernel"] = kernels
    return rows


def _server(
    reranker: Path,
    *,
    embedder: Path,
    device: str,
    data: Path,
    args: GpuOptions,
    report: dict[str, Any],
) -> dict[str, Any]:
    requests = scifact_requests(data, args.server_requests, 32)
    pairs = sum(len(docs) for _, docs in requests)
    port = free_port()
    env = {
        **os.environ,
        "RAGRANK_RERANK_MODEL": str(reranker),
        "RAGRANK_EMBED_MODEL": str(embedder),
        "RAGRANK_QDRANT_PATH": tempfile.mkdtemp(prefix="ragrank-bench-qdrant-"),
        "RAGRANK_QDRANT_URL": "",
        "RAGRANK_HOST": "127.0.0.1",
        "RAGRANK_PORT": str(port),
        "RAGRANK_DEVICE": device,
        "RAGRANK_PACKED": "on",
        "RAGRANK_REQUEST_TIMEOUT_S": "3600",
        "RAGRANK_LOG_LEVEL": "WARNING",
    }
    base = f"http://127.0.0.1:{port}"
    workload = Workload(requests=requests, lengths=[])

    def body(query: str, docs: list[str]) -> dict[str, Any]:
        return {"query": query, "documents": docs}

    rows: dict[str, Any] = {}
    log = Path(tempfile.mkdtemp(prefix="ragrank-bench-log-")) / "serve.log"
    rows["first_request_ms"] = {"warmup_on": None, "warmup_off": None}
    with server_process(ragrank_command("serve"), env, base + "/ready", log):
        rows["first_request_ms"]["warmup_on"] = first_request_ms(base, *requests[0])
        asyncio.run(drive(base + "/v1/rerank", body, Workload(requests[:8], []), 4))
        for clients in (16, 64):
            seconds, latencies = asyncio.run(drive(base + "/v1/rerank", body, workload, clients))
            result = RunResult(f"{clients} clients", pairs, seconds, latencies)
            rows[str(clients)] = result.summary()
            console.print(f"/v1/rerank, {clients} clients: {result.pairs_per_s:.1f} pairs/s")
    cold = {**env, "RAGRANK_WARMUP": "off", "RAGRANK_PORT": str(port := free_port())}
    base = f"http://127.0.0.1:{port}"
    with server_process(ragrank_command("serve"), cold, base + "/ready", log):
        rows["first_request_ms"]["warmup_off"] = first_request_ms(base, *requests[0])
    model_only = report["reranker"]["scifact"]["packed"]["pairs_per_s"]
    for name, row in rows.items():
        if name != "first_request_ms":
            row["over_model_only"] = round(row["pairs_per_s"] / model_only, 3)
    return rows


def _embedder(folder: Path, placement: Placement, data: Path, args: GpuOptions) -> dict[str, Any]:
    embedder = SentenceTransformerEmbedder(
        str(folder), query_prefix="query: ", passage_prefix="passage: ", placement=placement
    )
    dataset = load_beir(data)
    texts = [f"passage: {d.title} {d.text}".strip() for d in dataset.corpus.values()]
    inputs = embedder.encode_texts(texts[: args.pairs])
    return {
        ("packed" if packed else "padded"): round(
            forward_rate(embedder, inputs, packed=packed, budget=32_768, device=placement.device),
            1,
        )
        for packed in (True, False)
    }


def _agreement(folder: Path, placement: Placement, data: Path, queries: int) -> dict[str, float]:
    """Mean share of each query's top-10 that the fast path (packed, the placement's dtype)
    shares with the fp32 padded forward; with the logits' spread (their standard deviation
    within a query) and the fast path's RMS error, whose ratio says whether the agreement
    measures anything."""
    fast = CrossEncoderScorer(str(folder), placement=placement, packed="on")
    exact = CrossEncoderScorer(
        str(folder), placement=Placement(placement.device, torch.float32), packed="off"
    )
    shares, spreads, errors = [], [], []
    for query, docs in scifact_requests(data, queries, 100):
        plan = fast.plan_windows(query, docs)
        fast_logits = np.concatenate(
            [fast.forward(fast.collate(b)) for b in _chunks(plan.inputs, 64)]
        )
        exact_logits = np.concatenate(
            [exact.forward(exact.collate(b)) for b in _chunks(plan.inputs, 64)]
        )
        top_fast = set(np.argsort(-fast_logits, kind="stable")[:10].tolist())
        top_exact = set(np.argsort(-exact_logits, kind="stable")[:10].tolist())
        shares.append(len(top_fast & top_exact) / 10)
        spreads.append(float(np.std(exact_logits)))
        errors.append(float(np.sqrt(np.mean((fast_logits - exact_logits) ** 2))))
    spread, error = float(np.mean(spreads)), float(np.mean(errors))
    return {
        "top10": round(float(np.mean(shares)), 4),
        "logit_spread": round(spread, 6),
        "rms_error": round(error, 6),
        "spread_over_error": round(spread / error, 1) if error > 0 else float("inf"),
    }


def _chunks(items: Sequence[ModelInput], size: int) -> list[list[ModelInput]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def _print(report: dict[str, Any]) -> None:
    table = Table(title=f"reranker, model only ({report['device']}, {report['dtype']})")
    for column in ("tokens", "packed pairs/s", "peak", "padded pairs/s", "peak ", "packed/padded"):
        table.add_column(column, justify="right")
    for name in ("128", "256", "512", "scifact"):
        row = report["reranker"][name]
        table.add_row(
            name,
            f"{row['packed']['pairs_per_s']:.0f}",
            f"{row['packed']['peak_share']:.0%}",
            f"{row['padded']['pairs_per_s']:.0f}",
            f"{row['padded']['peak_share']:.0%}",
            f"{row['packed_over_padded']:.2f}",
        )
    console.print(table)
    console.print(f"packed by token budget: {report['reranker']['scifact_packed_by_budget']}")
    console.print(f"packed by varlen kernel: {report['reranker']['scifact_packed_by_kernel']}")
    servers = dict(report["server"])
    first = servers.pop("first_request_ms")
    console.print(
        f"first request of a fresh server: {first['warmup_on']} ms with warm-up, "
        f"{first['warmup_off']} ms without"
    )
    for clients, row in servers.items():
        console.print(
            f"/v1/rerank {clients} clients: {row['pairs_per_s']:.0f} pairs/s, "
            f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, "
            f"{row['over_model_only']:.2f} x model only"
        )
    console.print(f"embedder passages/s: {report['embedder']}")
    print_rates(report["families"], "one reranker of each family, model only")
    for model, agreement in report["agreement"].items():
        console.print(
            f"top-10 agreement with fp32 padded, {model} reranker: {agreement['top10']} (logit "
            f"spread {agreement['logit_spread']:.3g}, {agreement['spread_over_error']} x the "
            "fast path's RMS error)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
