"""The two model roles: an embedder (bi-encoder) and a scorer (cross-encoder).

Each role is a small Protocol so the server, the indexer and the tests can swap in fakes; the real
implementations load through sentence-transformers, by hub id or local folder.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from numpy.typing import NDArray

from ragrank.device import Placement, batch_limits, resolve_placement
from ragrank.errors import BatchTooLargeError, ModelFailedError, ModelLoadError
from ragrank.quantization import Agreement, calibration_groups, checked_agreement, quantize_int8
from ragrank.settings import Settings, env_name

log = logging.getLogger(__name__)

Vectors = NDArray[np.float32]
TokenSpans = list[tuple[int, int]]
Pair = tuple[str, str]

#: Documents longer than this many model windows are cut, unless a request says otherwise.
DEFAULT_WINDOWS_PER_DOC = 8


@dataclass(frozen=True)
class WindowPlan:
    """The (query, window) pairs to score for a list of documents, each fitting the model."""

    pairs: list[Pair]
    #: The document index each pair belongs to; a document scores its best window.
    owners: list[int]
    #: Tokens of each pair, special tokens included: the batching engine needs them, so the
    #: pairs are not tokenised a second time.
    lengths: list[int]

    @property
    def tokens(self) -> int:
        """Tokens the model will read."""
        return sum(self.lengths)


class Embedder(Protocol):
    """Turns text into L2-normalised vectors, applying the query or passage prefix by role."""

    model_id: str
    dimension: int
    #: Token limit of one input, prefix included.
    max_length: int
    query_prefix: str
    passage_prefix: str

    def embed_queries(self, texts: Sequence[str]) -> Vectors: ...

    def embed_passages(self, texts: Sequence[str]) -> Vectors: ...

    def text_lengths(self, texts: Sequence[str]) -> list[int]:
        """Tokens each text (prefix already applied) takes, capped at `max_length`."""
        ...

    def embed_batch(self, texts: Sequence[str]) -> Vectors:
        """One forward pass over texts whose prefixes are already applied."""
        ...

    def token_spans(self, text: str) -> TokenSpans:
        """Character (start, end) of each token of `text`, special tokens excluded."""
        ...


class Scorer(Protocol):
    """A cross-encoder: one relevance logit per (query, passage) pair."""

    model_id: str

    def score(self, query: str, passages: Sequence[str]) -> NDArray[np.float32]: ...

    def pair_lengths(self, pairs: Sequence[Pair]) -> list[int]:
        """Tokens each pair takes, special tokens included, capped at the model's limit."""
        ...

    def score_pairs(self, pairs: Sequence[Pair]) -> NDArray[np.float32]:
        """One forward pass: the float32 logit of each pair."""
        ...

    def plan_windows(
        self, query: str, documents: Sequence[str], max_tokens_per_doc: int | None = None
    ) -> WindowPlan:
        """Split each document (cut at `max_tokens_per_doc`) into overlapping windows that fit
        the model together with the query, which is capped at a quarter of the budget."""
        ...


@contextmanager
def _device_errors() -> Iterator[None]:
    """Translate CUDA failures into the errors the batching engine acts on."""
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        raise BatchTooLargeError("the device ran out of memory on this batch") from None
    except RuntimeError as exc:
        if "CUDA error" in str(exc):
            raise ModelFailedError(f"the model can no longer run: {exc}") from exc
        raise


class _SideTokenizer:
    """A private, locked copy of a model's tokenizer for work outside the model's thread
    (planning windows, counting tokens). A Rust fast tokenizer must not serve two threads at
    once: calls with different truncation or padding settings fail with "Already borrowed"."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = copy.deepcopy(tokenizer)
        # Planning reads whole documents on purpose; every call that must fit the model passes
        # `max_length` itself, so the "longer than the maximum" warning would only mislead.
        self._tokenizer.model_max_length = 1 << 30
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._tokenizer(*args, **kwargs)


def _token_spans(tokenizer: Any, texts: Sequence[str]) -> list[TokenSpans]:
    """Character (start, end) of each token of each text, special tokens excluded."""
    if not texts:
        return []
    encoded = tokenizer(
        list(texts), add_special_tokens=False, return_offsets_mapping=True, truncation=False
    )
    return [[(int(s), int(e)) for s, e in spans] for spans in encoded["offset_mapping"]]


def relevance(logits: NDArray[np.floating]) -> NDArray[np.float64]:
    """Sigmoid of the logits, computed in float64 so large logits do not saturate early."""
    return np.asarray(1.0 / (1.0 + np.exp(-logits.astype(np.float64))), dtype=np.float64)


_Model = TypeVar("_Model")


def local_model_folder(model_id: str) -> Path | None:
    """The folder a model setting names, when it names one that exists (else a hub id)."""
    folder = Path(model_id).expanduser()
    return folder if folder.is_dir() else None


def error_summary(exc: BaseException) -> str:
    """`Type: first line of the message`, for errors that name a model and a setting."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def load_model(role: str, model_id: str, setting: str, loader: Callable[[str], _Model]) -> _Model:
    """Load a model by local path or hub id, turning every failure into a `ModelLoadError`."""
    local = Path(model_id).expanduser()
    if model_id.startswith((".", "/", "~")) and not local.exists():
        raise ModelLoadError(
            f"The {role} model folder {model_id!r} does not exist. "
            f"Set {setting} to a model folder or a Hugging Face model id."
        )
    source = str(local) if local.exists() else model_id
    try:
        return loader(source)
    except Exception as exc:
        raise ModelLoadError(
            f"Could not load the {role} model {model_id!r}: {error_summary(exc)} "
            f"If the Hugging Face Hub is unreachable and the model is not cached, download it "
            f"elsewhere and set {setting} to its local folder (or point HF_HOME at a cache "
            f"that holds it)."
        ) from exc


class SentenceTransformerEmbedder:
    """A sentence-transformers bi-encoder with role prefixes and normalised output."""

    def __init__(
        self,
        model_id: str,
        *,
        query_prefix: str,
        passage_prefix: str,
        placement: Placement,
        batch_size: int = 32,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        def loader(source: str) -> SentenceTransformer:
            return SentenceTransformer(
                source, device=placement.device, model_kwargs={"dtype": placement.dtype}
            )

        self._model = load_model("embedding", model_id, env_name("embed_model"), loader)
        self.model_id = model_id
        dimension = self._model.get_embedding_dimension()
        if dimension is None:
            raise ModelLoadError(f"The embedding model {model_id!r} reports no dimension")
        self.dimension: int = int(dimension)
        limit = self._model.max_seq_length
        if limit is None:
            limit = int(getattr(self._model.tokenizer, "model_max_length", 512))
        self.max_length: int = min(int(limit), 100_000)
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self._batch_size = batch_size
        self._side = _SideTokenizer(self._model.tokenizer)
        # The API's engine and an in-process indexing worker may both embed.
        self._encode_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> SentenceTransformerEmbedder:
        return cls(
            settings.embed_model,
            query_prefix=settings.query_prefix or "",
            passage_prefix=settings.passage_prefix or "",
            placement=(placement := resolve_placement(settings.device, settings.dtype)),
            batch_size=batch_limits(placement, settings.embed_batch_size)[0],
        )

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        return self._encode([self.query_prefix + t for t in texts])

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        return self._encode([self.passage_prefix + t for t in texts])

    def token_spans(self, text: str) -> TokenSpans:
        return _token_spans(self._side, [text])[0]

    def text_lengths(self, texts: Sequence[str]) -> list[int]:
        encoded = self._side(list(texts), truncation=True, max_length=self.max_length)
        return [len(ids) for ids in encoded["input_ids"]]

    def embed_batch(self, texts: Sequence[str]) -> Vectors:
        return self._encode(list(texts), batch_size=max(len(texts), 1))

    def _encode(self, texts: list[str], batch_size: int | None = None) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with _device_errors(), self._encode_lock:
            vectors = self._model.encode(
                texts,
                batch_size=batch_size or self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)


class CrossEncoderScorer:
    """A one-logit cross-encoder run batch by batch under `torch.inference_mode()`.

    The forward pass is written out (rather than `CrossEncoder.predict`) so that the logits are
    read in float32 whatever dtype the model runs in.
    """

    def __init__(
        self,
        model_id: str,
        *,
        placement: Placement,
        batch_size: int = 16,
        max_length: int = 512,
        backend: str = "torch",
        min_agreement: float = 0.9,
    ) -> None:
        from sentence_transformers import CrossEncoder

        def loader(source: str) -> CrossEncoder:
            encoder: CrossEncoder = CrossEncoder(
                source,
                device=placement.device,
                max_length=max_length,
                model_kwargs={"dtype": placement.dtype},
            )
            return encoder

        encoder = load_model("reranking", model_id, env_name("rerank_model"), loader)
        if encoder.num_labels != 1:
            raise ModelLoadError(
                f"The reranking model {model_id!r} has {encoder.num_labels} output labels; "
                f"ragrank needs a one-logit cross-encoder. Set {env_name('rerank_model')}."
            )
        model = encoder.transformers_model
        if model is None:
            raise ModelLoadError(
                f"The reranking model {model_id!r} is not a transformers model; "
                f"set {env_name('rerank_model')} to a Hugging Face cross-encoder."
            )
        self.model_id = model_id
        model.train(False)
        self._model: torch.nn.Module = model
        self._tokenizer = encoder.tokenizer
        self._side = _SideTokenizer(self._tokenizer)
        model_limit = int(getattr(self._tokenizer, "model_max_length", max_length) or max_length)
        self.max_length = min(max_length, model_limit)
        self._device = placement.device
        self._batch_size = batch_size
        # Special tokens a pair adds: 4 for XLM-R (<s> q </s></s> d </s>), 3 for BERT.
        self._special_tokens = len(self._tokenizer("a", "b")["input_ids"]) - len(
            self._tokenizer("a b", add_special_tokens=False)["input_ids"]
        )
        #: How the int8 backend ranks against the float model; None on the torch backend.
        self.agreement: Agreement | None = None
        if backend == "int8":
            self._use_int8(min_agreement)

    def _use_int8(self, min_agreement: float) -> None:
        """Swap in the int8 model, if its rankings agree with the float model's."""
        backend, threshold = env_name("rerank_backend"), env_name("rerank_min_agreement")
        if self._device != "cpu":
            raise ModelLoadError(
                f"{backend}=int8 runs on the CPU only; set {backend}=torch on {self._device}"
            )
        quantized = quantize_int8(self._model)
        agreement = checked_agreement(
            calibration_groups(),
            lambda pairs: self._forward(self._model, pairs),
            lambda pairs: self._forward(quantized, pairs),
        )
        if agreement.mean_spearman < min_agreement:
            raise ModelLoadError(
                f"The int8 reranking model {self.model_id!r} ranks too differently from the "
                f"float one ({agreement}); {threshold} is {min_agreement:g}. "
                f"Set {backend}=torch, or lower {threshold} if that is acceptable."
            )
        log.info("reranker: int8 backend in use; against float32: %s", agreement)
        self._model = quantized
        self.agreement = agreement

    @classmethod
    def from_settings(cls, settings: Settings) -> CrossEncoderScorer:
        return cls(
            settings.rerank_model,
            placement=(placement := resolve_placement(settings.device, settings.dtype)),
            batch_size=batch_limits(placement, settings.rerank_batch_size)[0],
            max_length=settings.rerank_max_length,
            backend=settings.rerank_backend,
            min_agreement=settings.rerank_min_agreement,
        )

    def score(self, query: str, passages: Sequence[str]) -> NDArray[np.float32]:
        """Logits for one query against many passages, in length-sorted batches."""
        logits = np.zeros(len(passages), dtype=np.float32)
        order = sorted(range(len(passages)), key=lambda i: len(passages[i]))
        for start in range(0, len(order), self._batch_size):
            batch = order[start : start + self._batch_size]
            logits[batch] = self.score_pairs([(query, passages[i]) for i in batch])
        return logits

    def pair_lengths(self, pairs: Sequence[Pair]) -> list[int]:
        encoded = self._encode_pairs(pairs, tensors=False)
        return [len(ids) for ids in encoded["input_ids"]]

    def score_pairs(self, pairs: Sequence[Pair]) -> NDArray[np.float32]:
        return self._forward(self._model, pairs)

    def _forward(self, model: Any, pairs: Sequence[Pair]) -> NDArray[np.float32]:
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        features = self._encode_pairs(pairs, tensors=True).to(self._device)
        with _device_errors(), torch.inference_mode():
            # Logits leave the model in float32 whatever dtype it runs in.
            output = model(**features).logits.float().view(-1)
        return np.asarray(output.cpu().numpy(), dtype=np.float32)

    def plan_windows(
        self, query: str, documents: Sequence[str], max_tokens_per_doc: int | None = None
    ) -> WindowPlan:
        budget = self.max_length - self._special_tokens
        query_offsets = _token_spans(self._side, [query])[0]
        query_cap = max(1, budget // 4)
        if len(query_offsets) > query_cap:
            query = query[: query_offsets[query_cap - 1][1]]
        query_tokens = min(len(query_offsets), query_cap)
        # Two tokens of margin: a cut text can tokenise slightly differently at its edges.
        window = max(1, budget - query_tokens - 2)
        stride = max(1, window - window // 4)
        limit = max_tokens_per_doc or window * DEFAULT_WINDOWS_PER_DOC
        pairs: list[Pair] = []
        owners: list[int] = []
        lengths: list[int] = []
        for index, (document, all_offsets) in enumerate(
            zip(documents, _token_spans(self._side, documents), strict=True)
        ):
            offsets = all_offsets[:limit]
            start = 0
            while True:
                piece = offsets[start : start + window]
                text = document[piece[0][0] : piece[-1][1]] if piece else ""
                pairs.append((query, text))
                owners.append(index)
                lengths.append(len(piece) + query_tokens + self._special_tokens)
                if start + window >= len(offsets):
                    break
                start += stride
        return WindowPlan(pairs=pairs, owners=owners, lengths=lengths)

    def _encode_pairs(self, pairs: Sequence[Pair], *, tensors: bool) -> Any:
        """Padded tensors for a forward pass (the model's own thread, its own tokenizer), or
        token ids for counting (any thread, the side tokenizer)."""
        tokenizer = self._tokenizer if tensors else self._side
        return tokenizer(
            [query for query, _ in pairs],
            [passage for _, passage in pairs],
            padding=tensors,
            truncation="longest_first",
            max_length=self.max_length,
            return_tensors="pt" if tensors else None,
        )
