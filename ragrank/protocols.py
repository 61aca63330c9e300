"""The two model roles as Protocols, with their aliases: an embedder (bi-encoder) and a scorer
(cross-encoder). Torch-free, so that modules needing only these types stay light; the real
implementations live in `ragrank.backends.models`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from ragrank.calibration import Calibration, sigmoid
from ragrank.roles import RoleName

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence

    from ragrank.tokens import ModelInput, TokenSpans, WindowPlan

_Result = TypeVar("_Result")
Vectors = NDArray[np.float32]
Pair = tuple[str, str]
#: The two roles a served model plays, as the API names them (`ragrank.roles`).
ModelRole = RoleName


class TextEmbedder(Protocol):
    """What the indexer and the eval read of an embedder: its shape, its prefixes, and vectors
    for whole lists of texts (`ragrank.inference.EngineEmbedder` makes them through the
    model's engine)."""

    @property
    def model_id(self) -> str: ...
    @property
    def dimension(self) -> int: ...
    @property
    def max_length(self) -> int: ...
    @property
    def query_prefix(self) -> str: ...
    @property
    def passage_prefix(self) -> str: ...
    @property
    def backend(self) -> str: ...

    def embed_queries(self, texts: Sequence[str]) -> Vectors: ...

    def embed_passages(self, texts: Sequence[str]) -> Vectors: ...

    def token_spans(self, text: str) -> TokenSpans:
        """Character (start, end) of each token of `text`, special tokens excluded."""
        ...


class Embedder(Protocol):
    """Turns text into L2-normalised vectors, applying the query or passage prefix by role."""

    model_id: str
    dimension: int
    #: Token limit of one input, prefix included.
    max_length: int
    query_prefix: str
    passage_prefix: str
    #: How the model runs: `torch`, or a CPU backend's recipe (its vectors differ slightly).
    backend: str
    #: Whether batches are packed without padding (the token budget then counts real tokens).
    packed: bool

    def embed_queries(self, texts: Sequence[str]) -> Vectors: ...

    def embed_passages(self, texts: Sequence[str]) -> Vectors: ...

    def token_spans(self, text: str) -> TokenSpans:
        """Character (start, end) of each token of `text`, special tokens excluded."""
        ...

    def encode_texts(self, texts: Sequence[str]) -> list[ModelInput]:
        """Inputs for texts whose prefixes are already applied, cut at `max_length`."""
        ...

    def collate(self, inputs: Sequence[ModelInput]) -> Any:
        """A batch ready for `forward` (host thread)."""
        ...

    def forward(self, batch: Any) -> Vectors:
        """One forward pass over a collated batch (model thread)."""
        ...

    def upload(self, batch: Any) -> Any:
        """A collated batch moved to the model's device (model thread)."""
        ...

    def launch(self, batch: Any) -> Any:
        """`forward` without waiting for the vectors to reach the host (model thread)."""
        ...

    def fetch(self, launched: Any) -> Vectors:
        """The vectors of a `launch`ed pass, waited for on the host."""
        ...

    def warm_up(self, batch_items: int, batch_tokens: int) -> int:
        """Run representative shapes once before serving; returns the forward passes run."""
        ...


class Scorer(Protocol):
    """A cross-encoder: one relevance logit per (query, passage) pair."""

    model_id: str
    packed: bool

    def score(self, query: str, passages: Sequence[str]) -> NDArray[np.float32]: ...

    def score_pairs(self, pairs: Sequence[Pair]) -> NDArray[np.float32]:
        """The float32 logit of each text pair, cut to fit the model, in one forward pass."""
        ...

    def plan_windows(
        self, query: str, documents: Sequence[str], max_tokens_per_doc: int | None = None
    ) -> WindowPlan:
        """Split each document (cut at `max_tokens_per_doc`) into overlapping windows that fit
        the model together with the query, which is capped at a quarter of the budget."""
        ...

    def collate(self, inputs: Sequence[ModelInput]) -> Any:
        """A batch ready for `forward` (host thread)."""
        ...

    def forward(self, batch: Any) -> NDArray[np.float32]:
        """One forward pass over a collated batch: the float32 logit of each input."""
        ...

    def upload(self, batch: Any) -> Any:
        """A collated batch moved to the model's device (model thread)."""
        ...

    def launch(self, batch: Any) -> Any:
        """`forward` without waiting for the logits to reach the host (model thread)."""
        ...

    def fetch(self, launched: Any) -> NDArray[np.float32]:
        """The logits of a `launch`ed pass, waited for on the host."""
        ...

    def warm_up(self, batch_items: int, batch_tokens: int) -> int:
        """Run representative shapes once before serving; returns the forward passes run."""
        ...


def relevance(logits: NDArray[np.floating]) -> NDArray[np.float64]:
    """Sigmoid of the logits: an uncalibrated model's relevance score."""
    return sigmoid(logits)


class Reranked(Protocol):
    """One query's documents reranked: each document's logit, and the pairs scored."""

    @property
    def logits(self) -> list[float]: ...
    @property
    def pairs(self) -> int: ...


class Reranking(Protocol):
    """What the eval asks of `ragrank.inference.Inference`, from a thread of its own: many
    queries reranked at once, with a word on each batch for its progress bar."""

    @property
    def on_batch(self) -> list[Callable[[Any], None]]: ...

    def call(self, work: Coroutine[Any, Any, _Result]) -> _Result: ...

    def rerank_all(
        self, requests: Sequence[tuple[str, Sequence[str]]], *, model: str | None = None
    ) -> Coroutine[Any, Any, Sequence[Reranked]]: ...

    def calibration(self, model: str | None = None) -> Calibration | None:
        """The calibration of the reranker `model` names (absent: the default), if any."""
        ...
