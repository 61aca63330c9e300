"""Tokenise once: model inputs assembled from token ids.

A request's query and each of its documents are tokenised once, without special tokens; a
document's windows are slices of its ids, and each (query, window) input is assembled from ids
with the model's own special tokens and token types. No window text is tokenised again.

Each host thread gets its own copy of the tokenizer: a Rust fast tokenizer must not serve two
threads at once, and copies let the host pool tokenise on every core.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

TokenIds = list[int]
TokenSpans = list[tuple[int, int]]

#: Documents longer than this many model windows are cut, unless a request says otherwise.
DEFAULT_WINDOWS_PER_DOC = 8


@dataclass(frozen=True, slots=True)
class ModelInput:
    """One sequence for the model: its ids, special tokens included, and its token types
    (None where the model has a single type)."""

    ids: TokenIds
    type_ids: TokenIds | None = None

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class WindowPlan:
    """The (query, window) inputs to score for a list of documents, each fitting the model."""

    inputs: list[ModelInput]
    #: The document index each input belongs to; a document scores its best window.
    owners: list[int]
    #: Tokens of the query in each input (after its cap).
    query_tokens: int = 0

    @property
    def lengths(self) -> list[int]:
        return [len(item) for item in self.inputs]

    @property
    def tokens(self) -> int:
        """Tokens the model will read, special tokens included."""
        return sum(len(item) for item in self.inputs)


@dataclass(frozen=True)
class Template:
    """Where a model's tokenizer puts its special tokens around one text or a pair:
    `prefix A suffix` and `pair_prefix A middle B pair_suffix`, with the type of each part."""

    prefix: TokenIds
    suffix: TokenIds
    pair_prefix: TokenIds
    middle: TokenIds
    pair_suffix: TokenIds
    #: Token type of each part of a pair: (prefix, A, middle, B, suffix).
    pair_types: tuple[TokenIds, int, TokenIds, int, TokenIds]
    single_types: tuple[TokenIds, int, TokenIds]
    #: Whether token types vary at all; if not, inputs carry none.
    uses_types: bool

    @property
    def pair_specials(self) -> int:
        return len(self.pair_prefix) + len(self.middle) + len(self.pair_suffix)

    @property
    def single_specials(self) -> int:
        return len(self.prefix) + len(self.suffix)


def _locate(full: Sequence[int], part: Sequence[int], start: int) -> int:
    for index in range(start, len(full) - len(part) + 1):
        if list(full[index : index + len(part)]) == list(part):
            return index
    raise ValueError("the tokenizer does not place its texts as contiguous ids")


def derive_template(backend: Any) -> Template:
    """Read the special-token layout off the tokenizer's own post-processor, by encoding two
    probe texts alone and as a pair."""
    probe_a, probe_b = "alpha beta", "gamma delta"
    ids_a = backend.encode(probe_a, add_special_tokens=False).ids
    ids_b = backend.encode(probe_b, add_special_tokens=False).ids
    pair = backend.encode(probe_a, probe_b, add_special_tokens=True)
    single = backend.encode(probe_a, add_special_tokens=True)
    a_at = _locate(pair.ids, ids_a, 0)
    b_at = _locate(pair.ids, ids_b, a_at + len(ids_a))
    s_at = _locate(single.ids, ids_a, 0)
    p_ids, p_types = list(pair.ids), list(pair.type_ids)
    s_ids, s_types = list(single.ids), list(single.type_ids)
    a_end, b_end, s_end = a_at + len(ids_a), b_at + len(ids_b), s_at + len(ids_a)
    if len(set(p_types[a_at:a_end])) > 1 or len(set(p_types[b_at:b_end])) > 1:
        raise ValueError("the tokenizer gives one text several token types")
    return Template(
        prefix=s_ids[:s_at],
        suffix=s_ids[s_end:],
        pair_prefix=p_ids[:a_at],
        middle=p_ids[a_end:b_at],
        pair_suffix=p_ids[b_end:],
        pair_types=(
            p_types[:a_at],
            p_types[a_at] if ids_a else 0,
            p_types[a_end:b_at],
            p_types[b_at] if ids_b else 0,
            p_types[b_end:],
        ),
        single_types=(s_types[:s_at], s_types[s_at] if ids_a else 0, s_types[s_end:]),
        uses_types=any(p_types) or any(s_types),
    )


@dataclass(frozen=True)
class PairPrompt:
    """A prompt that wraps a (query, document) pair in text, as decoder rerankers read it:
    `prefix query middle document suffix`. A space that ends `prefix` or `middle` is read as
    the start of the text after it, as the tokenizer would read the whole prompt."""

    prefix: str
    middle: str
    suffix: str
    #: Where the prompt came from: the model folder's chat template, or the documented default.
    source: str = "default"

    @property
    def leads(self) -> tuple[str, str]:
        """What goes before the query's and the document's text when they are tokenised."""
        return (
            " " if self.prefix.endswith(" ") else "",
            " " if self.middle.endswith(" ") else "",
        )

    def template(self, backend: Any) -> Template:
        """The prompt's parts as ids; the model reads no token types."""

        def ids(text: str) -> TokenIds:
            return list(backend.encode(text, add_special_tokens=False).ids)

        query_lead, document_lead = self.leads
        pair_prefix = ids(self.prefix[: len(self.prefix) - len(query_lead)])
        middle = ids(self.middle[: len(self.middle) - len(document_lead)])
        suffix = ids(self.suffix)
        return Template(
            prefix=[],
            suffix=[],
            pair_prefix=pair_prefix,
            middle=middle,
            pair_suffix=suffix,
            pair_types=([0] * len(pair_prefix), 0, [0] * len(middle), 0, [0] * len(suffix)),
            single_types=([], 0, []),
            uses_types=False,
        )


class Tokens:
    """A model's tokenizer for host threads: ids without special tokens, inputs assembled from
    ids, and window planning. Thread-safe: each thread tokenises with its own copy.

    Pairs are laid out as the tokenizer lays them out, or by `prompt` for models that read a
    pair inside a prompt; `types=False` drops token types for models that have none."""

    def __init__(
        self,
        tokenizer: Any,
        max_length: int,
        *,
        prompt: PairPrompt | None = None,
        types: bool = True,
    ) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError("ragrank needs a fast (Rust) tokenizer")
        self._backend = copy.deepcopy(backend)
        # Inputs are cut and padded here, by ids; the tokenizer only splits text.
        self._backend.no_truncation()
        self._backend.no_padding()
        template = derive_template(self._backend) if prompt is None else prompt.template(backend)
        if not types and template.uses_types:
            template = dataclasses.replace(template, uses_types=False)
        self.template = template
        self.prompt = prompt
        self._query_lead, self._document_lead = ("", "") if prompt is None else prompt.leads
        self.max_length = max_length
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._local = threading.local()
        self._copy_lock = threading.Lock()

    def _own(self) -> Any:
        backend = getattr(self._local, "backend", None)
        if backend is None:
            with self._copy_lock:
                backend = copy.deepcopy(self._backend)
            self._local.backend = backend
        return backend

    def ids(self, texts: Sequence[str]) -> list[TokenIds]:
        """Token ids of each text, special tokens excluded, uncut."""
        if not texts:
            return []
        return [e.ids for e in self._own().encode_batch_fast(list(texts), add_special_tokens=False)]

    def spans(self, texts: Sequence[str]) -> list[TokenSpans]:
        """Character (start, end) of each token of each text, special tokens excluded."""
        if not texts:
            return []
        encoded = self._own().encode_batch(list(texts), add_special_tokens=False)
        return [[(int(s), int(e)) for s, e in item.offsets] for item in encoded]

    def single(self, ids: TokenIds) -> ModelInput:
        """One text's input, its content cut to fit `max_length` with the special tokens."""
        t = self.template
        ids = ids[: max(0, self.max_length - t.single_specials)]
        full = t.prefix + ids + t.suffix
        if not t.uses_types:
            return ModelInput(full)
        before, kind, after = t.single_types
        return ModelInput(full, before + [kind] * len(ids) + after)

    def pair(self, query: TokenIds, passage: TokenIds) -> ModelInput:
        """A (query, passage) input, assembled as the tokenizer assembles a pair."""
        t = self.template
        full = t.pair_prefix + query + t.middle + passage + t.pair_suffix
        if not t.uses_types:
            return ModelInput(full)
        before, kind_a, between, kind_b, after = t.pair_types
        types = before + [kind_a] * len(query) + between + [kind_b] * len(passage) + after
        return ModelInput(full, types)

    def texts(self, texts: Sequence[str]) -> list[ModelInput]:
        """Inputs for texts whose prefixes are already applied."""
        return [self.single(ids) for ids in self.ids(texts)]

    def pairs(self, pairs: Sequence[tuple[str, str]]) -> list[ModelInput]:
        """Inputs for text pairs, each cut to fit as `truncation="longest_first"` cuts it."""
        budget = self.max_length - self.template.pair_specials
        queries = self.ids([self._query_lead + query for query, _ in pairs])
        passages = self.ids([self._document_lead + passage for _, passage in pairs])
        inputs = []
        for query, passage in zip(queries, passages, strict=True):
            keep_query, keep_passage = _longest_first(len(query), len(passage), budget)
            inputs.append(self.pair(query[:keep_query], passage[:keep_passage]))
        return inputs

    def plan_windows(
        self, query: str, documents: Sequence[str], max_tokens_per_doc: int | None = None
    ) -> WindowPlan:
        """Split each document (cut at `max_tokens_per_doc`) into overlapping windows that fit
        the model together with the query, which is capped at a quarter of the budget."""
        budget = self.max_length - self.template.pair_specials
        query_ids = self.ids([self._query_lead + query])[0][: max(1, budget // 4)]
        window = max(1, budget - len(query_ids))
        stride = max(1, window - window // 4)
        limit = max_tokens_per_doc or window * DEFAULT_WINDOWS_PER_DOC
        inputs: list[ModelInput] = []
        owners: list[int] = []
        texts = [self._document_lead + document for document in documents]
        for index, document_ids in enumerate(self.ids(texts)):
            ids = document_ids[:limit]
            start = 0
            while True:
                inputs.append(self.pair(query_ids, ids[start : start + window]))
                owners.append(index)
                if start + window >= len(ids):
                    break
                start += stride
        return WindowPlan(inputs=inputs, owners=owners, query_tokens=len(query_ids))


def _longest_first(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many tokens of each text `longest_first` truncation keeps: the longer text gives way
    first, and if both are long they split the budget (the Rust tokenizer's own rule)."""
    if first + second <= budget:
        return first, second
    short, long_ = sorted((first, second))
    long_ = short if short > budget else max(short, budget - short)
    if short + long_ > budget:
        short = budget // 2
        long_ = short + budget % 2
    return (long_, short) if first > second else (short, long_)
