"""The reranker families ragrank serves, each with its scoring rule, and the prompt decoder
rerankers read. Torch-free: the families are told apart by a loaded model's class name.

A family fixes how a (query, document) pair becomes one logit: which row of the last hidden
states is read (the first token, the mean, or the last token), which head turns it into a
logit, whether the pair is wrapped in a prompt, and how long a window may be.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ragrank.errors import ModelLoadError
from ragrank.settings import env_name
from ragrank.tokens import PairPrompt

if TYPE_CHECKING:
    from collections.abc import Sequence

#: The row of the last hidden states a family's head reads.
Pooling = Literal["first", "mean", "last"]
#: What turns that row into one logit: BERT's pooler then classifier; XLM-R's classification
#: head; ModernBERT's head then classifier; a decoder's `yes` minus `no` output rows; a
#: sequence-classification decoder's score layer.
Head = Literal["bert-pooler", "classifier", "modernbert", "yes-no", "score"]

#: The longest window a long-context family is given by default: the model's own limit, up to
#: this many tokens.
LONG_CONTEXT_TOKENS = 8192
#: The window of a family trained on short pairs (BERT, XLM-R), unless the setting says more.
SHORT_CONTEXT_TOKENS = 512


@dataclass(frozen=True)
class RerankerFamily:
    """One family of cross-encoders: what it is, how it scores, and how it is windowed."""

    name: str
    #: The transformers classes of the family's checkpoints.
    architectures: tuple[str, ...]
    #: The scoring rule, in a line (the docs and the start-up error read it).
    scoring: str
    pooling: Pooling
    head: Head
    #: Whether the pair is wrapped in a prompt (decoder rerankers) rather than the tokenizer's
    #: own pair layout.
    prompted: bool = False
    #: Whether documents are windowed by the model's own maximum length (up to 8K) by default.
    long_context: bool = False
    #: Whether the model reads token types (BERT's segment ids).
    token_types: bool = True


FAMILIES: tuple[RerankerFamily, ...] = (
    RerankerFamily(
        name="bert",
        architectures=("BertForSequenceClassification",),
        scoring="the [CLS] row through BERT's pooler and its one-logit classifier",
        pooling="first",
        head="bert-pooler",
    ),
    RerankerFamily(
        name="xlm-roberta",
        architectures=("XLMRobertaForSequenceClassification", "RobertaForSequenceClassification"),
        scoring="the <s> row through XLM-R's classification head (dense, tanh, one logit)",
        pooling="first",
        head="classifier",
    ),
    RerankerFamily(
        name="modernbert",
        architectures=("ModernBertForSequenceClassification",),
        scoring="the [CLS] row, or the mean of all rows (the model's `classifier_pooling`), "
        "through ModernBERT's head and its one-logit classifier",
        pooling="first",
        head="modernbert",
        long_context=True,
        token_types=False,
    ),
    RerankerFamily(
        name="qwen3-reranker",
        architectures=("Qwen3ForCausalLM",),
        scoring="the last token's `yes` logit minus its `no` logit (the log-odds of `yes`), "
        "the pair wrapped in the reranker's prompt",
        pooling="last",
        head="yes-no",
        prompted=True,
        long_context=True,
        token_types=False,
    ),
    RerankerFamily(
        name="qwen3-seq-cls",
        architectures=("Qwen3ForSequenceClassification",),
        scoring="the last token's one logit (the `yes` row minus the `no` row, folded into a "
        "classifier by the conversion), the pair wrapped in the reranker's prompt",
        pooling="last",
        head="score",
        prompted=True,
        long_context=True,
        token_types=False,
    ),
)


def family_names() -> str:
    return ", ".join(f.name for f in FAMILIES)


def reranker_family(model: Any, model_id: str) -> RerankerFamily:
    """The family of a loaded transformers model, or a `ModelLoadError` listing the families."""
    name = type(model).__name__
    for family in FAMILIES:
        if name in family.architectures:
            if family.name == "modernbert" and model.config.classifier_pooling == "mean":
                return dataclasses.replace(family, pooling="mean")
            return family
    raise ModelLoadError(
        f"The reranking model {model_id!r} loads as {name}, which is not a reranker family "
        f"ragrank serves ({family_names()}; see docs/models.md). Set "
        f"{env_name('rerank_model')} to a model of one of them."
    )


def window_length(family: RerankerFamily, setting: int, model_limit: int) -> int:
    """Tokens per (query, window) input: the setting when given (`0`: the family's default),
    never past the model's own limit."""
    if setting:
        return min(setting, model_limit)
    default = LONG_CONTEXT_TOKENS if family.long_context else SHORT_CONTEXT_TOKENS
    return min(default, model_limit)


#: The instruction the Qwen3-Reranker model card's template uses when a caller gives none.
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

#: The Qwen3-Reranker model card's prompt, split around the query and the document.
_SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
_ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def default_prompt(instruction: str = DEFAULT_INSTRUCTION) -> PairPrompt:
    """The prompt of the Qwen3-Reranker model card, for a folder whose files carry none."""
    return PairPrompt(
        prefix=f"{_SYSTEM}<Instruct>: {instruction}\n<Query>: ",
        middle="\n<Document>: ",
        suffix=_ASSISTANT,
        source="default",
    )


#: Texts rendered through a chat template to find where it puts the query and the document.
_PROBES = ("ragrankprobequery", "ragrankprobedocument")


def folder_prompt(tokenizer: Any) -> PairPrompt | None:
    """The prompt a model folder's own chat template gives a (query, document) pair, as
    sentence-transformers renders pairs (one message per role, `query` then `document`);
    None when the folder has no chat template or its template does not carry both."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [
        {"role": "query", "content": _PROBES[0]},
        {"role": "document", "content": _PROBES[1]},
    ]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that cannot render these roles: the default applies
        return None
    if not isinstance(rendered, str):
        return None
    return _split(rendered, _PROBES)


def _split(rendered: str, probes: Sequence[str]) -> PairPrompt | None:
    query_at = rendered.find(probes[0])
    document_at = rendered.find(probes[1])
    if query_at < 0 or document_at < query_at or any(rendered.count(p) != 1 for p in probes):
        return None
    return PairPrompt(
        prefix=rendered[:query_at],
        middle=rendered[query_at + len(probes[0]) : document_at],
        suffix=rendered[document_at + len(probes[1]) :],
        source="chat template",
    )


def pair_prompt(tokenizer: Any, instruction: str | None) -> PairPrompt:
    """A decoder reranker's prompt: the folder's chat template's when it carries a pair,
    else the model card's with `instruction` (default: the card's own)."""
    return folder_prompt(tokenizer) or default_prompt(instruction or DEFAULT_INSTRUCTION)
