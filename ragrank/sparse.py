"""BM25 sparse vectors: the lexical half of hybrid retrieval.

A document's vector holds BM25's term-frequency part for each of its terms,
`tf * (k + 1) / (tf + k * (1 - b + b * length / avg_len))`; a query's holds 1.0 for each
distinct term. The collection declares the IDF modifier, so Qdrant multiplies each term by
its inverse document frequency at query time and keeps those statistics itself as points
come and go. The score of a point is then exactly BM25.

Two tokenisers, both offline and both multilingual:
- `bm25`: Qdrant's own BM25 (`qdrant_edge.Bm25`, the configuration shape of the Qdrant
  server's built-in one): a Unicode word tokenizer with CJK and Thai segmentation, lowercasing,
  and one language's stopwords and stemmer (or none);
- `subword`: the embedding model's own tokenizer, whose vocabulary ids are the terms.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import qdrant_edge as edge

from ragrank.errors import SettingsError
from ragrank.settings import Settings, env_name

if TYPE_CHECKING:
    from collections.abc import Sequence

#: The name of the sparse vector in every collection.
SPARSE_VECTOR = "bm25"


@dataclass(frozen=True)
class SparseVector:
    """Strictly increasing term indices and one positive, finite weight per index."""

    indices: tuple[int, ...] = ()
    values: tuple[float, ...] = ()


@dataclass(frozen=True)
class Bm25Params:
    """BM25's term saturation `k`, length normalisation `b`, and the document length (in
    terms) that normalisation is relative to."""

    k: float = 1.2
    b: float = 0.75
    avg_len: float = 256.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k) and self.k >= 0):
            raise SettingsError(f"{env_name('bm25_k')} must be a number of at least 0")
        if not (math.isfinite(self.b) and 0 <= self.b <= 1):
            raise SettingsError(f"{env_name('bm25_b')} must be between 0 and 1")
        if not (math.isfinite(self.avg_len) and self.avg_len > 0):
            raise SettingsError(f"{env_name('bm25_avg_len')} must be above 0")

    def weight(self, tf: int, length: int) -> float:
        return tf * (self.k + 1) / (tf + self.k * (1 - self.b + self.b * length / self.avg_len))


class SparseEncoder(Protocol):
    """Turns text into BM25 sparse vectors."""

    #: Everything that shapes the vectors, as a string: it is part of each document's stamp,
    #: so that changing it re-indexes.
    recipe: str

    def documents(self, texts: Sequence[str]) -> list[SparseVector]: ...

    def query(self, text: str) -> SparseVector: ...


class QdrantBm25:
    """Qdrant's BM25 with its multilingual tokenizer; `language` picks the stopwords and the
    Snowball stemmer (`none`: neither, every word kept as written)."""

    def __init__(self, params: Bm25Params, language: str = "english") -> None:
        options: dict[str, Any] = {}
        if language == "none":
            options = {"stopwords": edge.StopwordsSet(), "stemmer": edge.DisabledStemmer()}
        else:
            options = {"language": language}
        try:
            self._model = edge.Bm25(
                edge.Bm25Config(
                    k=params.k,
                    b=params.b,
                    avg_len=params.avg_len,
                    tokenizer=edge.TokenizerType.Multilingual,
                    **options,
                )
            )
        except ValueError as exc:
            raise SettingsError(
                f"{env_name('bm25_language')}={language!r} is not a language Qdrant's BM25 "
                f"knows ({exc}); use a language name such as english, german or french, or none"
            ) from None
        self.recipe = json.dumps(["bm25", language, params.k, params.b, params.avg_len])

    def documents(self, texts: Sequence[str]) -> list[SparseVector]:
        return [_sorted(self._model.embed_document(text)) for text in texts]

    def query(self, text: str) -> SparseVector:
        return _sorted(self._model.embed_query(text))


class SubwordBm25:
    """BM25 over the vocabulary ids of a Hugging Face tokenizer (the embedding model's)."""

    def __init__(self, params: Bm25Params, tokenizer: Any, model_id: str) -> None:
        self._params = params
        self._tokenizer = tokenizer
        self.recipe = json.dumps(["subword", model_id, params.k, params.b, params.avg_len])

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        # Every term counts, however long the text: no truncation, and no warning about it.
        encoded = self._tokenizer(
            list(texts), add_special_tokens=False, truncation=False, verbose=False
        )
        return [list(ids) for ids in encoded["input_ids"]]

    def documents(self, texts: Sequence[str]) -> list[SparseVector]:
        vectors = []
        for ids in self._ids(texts):
            counts = sorted(Counter(ids).items())
            vectors.append(
                SparseVector(
                    tuple(term for term, _ in counts),
                    tuple(self._params.weight(tf, len(ids)) for _, tf in counts),
                )
            )
        return vectors

    def query(self, text: str) -> SparseVector:
        terms = sorted(set(self._ids([text])[0]))
        return SparseVector(tuple(terms), (1.0,) * len(terms))


def _sorted(vector: edge.SparseVector) -> SparseVector:
    pairs = sorted(zip(vector.indices, vector.values, strict=True))
    return SparseVector(tuple(i for i, _ in pairs), tuple(float(v) for _, v in pairs))


def sparse_encoder(settings: Settings) -> SparseEncoder | None:
    """The encoder the settings name, or None for dense vectors only."""
    params = Bm25Params(k=settings.bm25_k, b=settings.bm25_b, avg_len=settings.bm25_avg_len)
    if settings.sparse == "none":
        return None
    if settings.sparse == "bm25":
        return QdrantBm25(params, settings.bm25_language)
    from transformers import AutoTokenizer

    from ragrank.loading import load_model

    tokenizer = load_model(
        "embedding", settings.embed_model, env_name("embed_model"), AutoTokenizer.from_pretrained
    )
    return SubwordBm25(params, tokenizer, settings.embed_model)
