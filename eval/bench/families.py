"""`python -m eval.bench.families`: pairs/s of one reranker of each family, at SciFact lengths.

One random-weight model per family, of a real checkpoint's shape:

* ``minilm-l6``: cross-encoder/ms-marco-MiniLM-L-6-v2 (BERT; its real config and tokenizer);
* ``bge-reranker-v2-m3``: BAAI/bge-reranker-v2-m3 (XLM-R; its real config and tokenizer);
* ``modernbert-base``: answerdotai/ModernBERT-base's config, as gte-reranker-modernbert-base
  has it, with a one-logit head; BERT's WordPiece tokenizer stands in for ModernBERT's own;
* ``qwen3-reranker-0.6b``: Qwen3-0.6B's config, scored by `yes` and `no` in the reranker's
  prompt; XLM-R's tokenizer (with Qwen's chat tokens) stands in for Qwen's own.

Each scores the same SciFact (query, abstract) pairs, windowed as the server windows them (one
window per abstract for the 8K families), in length-sorted batches under the device's token
budget, packed on CUDA and padded on a CPU as the server runs them. The report gives pairs/s
and the mean tokens per input; stand-in tokenizers make the two 8K families' counts
approximate. Random weights: speed only, never relevance.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

from eval.bench.options import SHARED_DIR, XLMR_TOKENIZER, FamiliesOptions, bench_data
from eval.bench.rates import forward_rate, scifact_requests
from ragrank.device import Placement, batch_limits, resolve_placement
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

console = Console()

MINILM = SHARED_DIR / "models" / "ms-marco-MiniLM-L-6-v2-noweights"
BGE = SHARED_DIR / "models" / "bge-reranker-v2-m3"

#: answerdotai/ModernBERT-base's config.json (the fields that shape its cost).
MODERNBERT_BASE = {
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "max_position_embeddings": 8192,
    "vocab_size": 50368,
    "classifier_pooling": "mean",
}
#: Qwen/Qwen3-0.6B's config.json (the base of Qwen3-Reranker-0.6B).
QWEN3_06B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1_000_000,
    "vocab_size": 151669,
    "tie_word_embeddings": True,
}
#: What `--tiny` shrinks every family to.
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128}


@dataclass(frozen=True)
class FamilyModel:
    name: str
    #: The checkpoint whose shape it has.
    shape_of: str
    tokenizer: str
    build: Callable[[Path, bool], Path]


def _minilm(out: Path, tiny: bool) -> Path:
    from transformers import AutoConfig, AutoTokenizer

    from eval.random_models import save_random_model

    config = AutoConfig.from_pretrained(str(MINILM))
    if tiny:
        config.update({**TINY, "num_attention_heads": 4})
    tokenizer = AutoTokenizer.from_pretrained(str(MINILM))
    return save_random_model("reranker", config, tokenizer, out)


def _bge(out: Path, tiny: bool) -> Path:
    from transformers import AutoConfig

    from eval.random_models import load_tokenizer, save_random_model

    config = AutoConfig.from_pretrained(str(BGE))
    if tiny:
        config.update({**TINY, "num_attention_heads": 4})
    tokenizer = load_tokenizer(XLMR_TOKENIZER, out.with_name(out.name + "-tok"), 8192)
    return save_random_model("reranker", config, tokenizer, out)


def _modernbert(out: Path, tiny: bool) -> Path:
    from transformers import AutoTokenizer

    from eval.random_models import save_family_model, tiny_modernbert_config

    tokenizer = AutoTokenizer.from_pretrained(str(MINILM), model_max_length=8192)
    shape: dict[str, Any] = {**MODERNBERT_BASE}
    if tiny:
        shape |= {**TINY, "num_attention_heads": 4}
    config = tiny_modernbert_config(tokenizer, **shape)
    return save_family_model("modernbert", config, tokenizer, out)


def _qwen3(out: Path, tiny: bool) -> Path:
    from eval.random_models import (
        QWEN_SPECIALS,
        load_tokenizer,
        save_family_model,
        tiny_qwen3_config,
    )

    tokenizer = load_tokenizer(XLMR_TOKENIZER, out.with_name(out.name + "-tok"), 8192)
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_SPECIALS[1:]})
    tokenizer.add_tokens(["yes", "no"])
    shape: dict[str, Any] = {**QWEN3_06B, "vocab_size": max(len(tokenizer), 151669)}
    if tiny:
        shape |= {**TINY, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    config = tiny_qwen3_config(tokenizer, **shape)
    return save_family_model("qwen3-reranker", config, tokenizer, out)


FAMILY_MODELS = (
    FamilyModel("minilm-l6", "cross-encoder/ms-marco-MiniLM-L-6-v2", "its own", _minilm),
    FamilyModel("bge-reranker-v2-m3", "BAAI/bge-reranker-v2-m3", "its own", _bge),
    FamilyModel("modernbert-base", "answerdotai/ModernBERT-base", "BERT's (stand-in)", _modernbert),
    FamilyModel("qwen3-reranker-0.6b", "Qwen/Qwen3-Reranker-0.6B", "XLM-R's (stand-in)", _qwen3),
)


def build_family_models(out: Path, *, tiny: bool) -> dict[str, Path]:
    """Each family's model folder under `out`, built unless an earlier run left it there; a
    family whose shared config is missing is left out."""
    if not (MINILM.is_dir() and BGE.is_dir() and XLMR_TOKENIZER.exists()):
        raise SystemExit(f"the family benchmark needs the shared configs under {SHARED_DIR}")
    folders = {}
    for family in FAMILY_MODELS:
        folder = out / family.name
        if not (folder / "config.json").exists():
            family.build(folder, tiny)
        folders[family.name] = folder
    return folders


def family_rates(
    folders: dict[str, Path],
    placement: Placement,
    requests: Sequence[tuple[str, list[str]]],
) -> dict[str, Any]:
    """Pairs/s of each family's forward passes on `requests` (windowed, collated beforehand),
    with the mean tokens per input and the parameter count."""
    from ragrank.backends.models import CrossEncoderScorer

    packed = placement.device.startswith("cuda")
    budget = batch_limits(placement)[1]
    rows: dict[str, Any] = {}
    for family in FAMILY_MODELS:
        if family.name not in folders:
            continue
        scorer = CrossEncoderScorer(
            str(folders[family.name]), placement=placement, packed="on" if packed else "off"
        )
        inputs = []
        for query, documents in requests:
            inputs.extend(scorer.plan_windows(query, documents).inputs)
        rate = forward_rate(scorer, inputs, packed=packed, budget=budget, device=placement.device)
        parameters = sum(p.numel() for p in scorer._model.parameters())
        rows[family.name] = {
            "family": scorer.family.name,
            "shape_of": family.shape_of,
            "tokenizer": family.tokenizer,
            "parameters_m": round(parameters / 1e6, 1),
            "window": scorer.max_length,
            "pairs": len(inputs),
            "tokens_mean": round(float(np.mean([len(i) for i in inputs])), 1),
            "pairs_per_s": round(rate, 2),
        }
        console.print(f"{family.name}: {rows[family.name]}")
        del scorer
    return rows


def print_rates(rows: dict[str, Any], title: str) -> None:
    table = Table(title=title)
    for column in ("family", "shape of", "params (M)", "tokens/pair", "pairs/s"):
        table.add_column(column, justify="right")
    for name, row in rows.items():
        table.add_row(
            name,
            row["shape_of"],
            f"{row['parameters_m']:.0f}",
            f"{row['tokens_mean']:.0f}",
            f"{row['pairs_per_s']:.1f}",
        )
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_options(
        FamiliesOptions, argv, prog="python -m eval.bench.families", description=__doc__
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    placement = resolve_placement(args.device, args.dtype)
    data = bench_data(args.data)
    out = args.out or Path("eval-results") / time.strftime("bench-families-%Y%m%d-%H%M%S.json")
    report: dict[str, Any] = {
        "device": placement.device,
        "dtype": str(placement.dtype),
        "data": str(data),
        "threads": _threads(),
    }
    with tempfile.TemporaryDirectory(prefix="ragrank-bench-families-") as scratch:
        started = time.perf_counter()
        folders = build_family_models(args.models or Path(scratch), tiny=args.tiny)
        console.print(f"models ready in {time.perf_counter() - started:.0f} s")
        requests = scifact_requests(data, args.queries, args.documents)
        report["families"] = family_rates(folders, placement, requests)
    print_rates(
        report["families"], f"rerankers, model only ({placement.device}, {placement.dtype})"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out}")
    return 0


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


if __name__ == "__main__":
    raise SystemExit(main())
