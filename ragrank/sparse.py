"""BM25 sparse vectors: the lexical half of hybrid retrieval.

A document's vector holds BM25's term-frequency part for each of its terms,
`tf * (k + 1) / (tf + k * (1 - b + b * length / avg_len))`; a query's holds 1.0 for each
distinct term. The collection declares the IDF modifier, so Qdrant multiplies each term by
its inverse document frequency at query time and keeps those statistics itself as points
come and go. The score of a point is then exactly BM25.

With `auto`, every chunk is analysed in its own language and all of them share one sparse
space and one IDF: a term is a hash of its (stemmed) form, so a German stem and an English
one are different terms unless they are spelled alike, and a query analysed as German meets
German chunks. Words spelled alike across languages (names, numbers, loanwords) then match
across languages, as they should.

Two tokenisers, both offline and both multilingual:
- `bm25`: Qdrant's own BM25 (`qdrant_edge.Bm25`, the configuration shape of the Qdrant
  server's built-in one): a Unicode word tokenizer with CJK and Thai segmentation, lowercasing,
  and a language's stopwords and stemmer: each text's own (`auto`), one for all, or none;
- `subword`: the embedding model's own tokenizer, whose vocabulary ids are the terms.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import qdrant_edge as edge

from ragrank.errors import SettingsError
from ragrank.language import ANALYSERS, CODES, DETECTOR, declared_language, detect
from ragrank.settings import Settings, env_name

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

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


@dataclass(frozen=True)
class SparseQuery:
    """A query's BM25 vector and the language(s) it was analysed as: an ISO 639-1 code, two
    joined by `+` when the query's language was uncertain, or None when no language applies
    (no stemming, or the subword tokeniser)."""

    vector: SparseVector
    language: str | None = None


class SparseEncoder(Protocol):
    """Turns text into BM25 sparse vectors."""

    #: Everything that shapes the vectors, as a string: it is part of each document's stamp,
    #: so that changing it re-indexes.
    recipe: str
    #: Whether each chunk's language is identified (and stored as its `lang` metadata).
    detects: bool

    def language_of(self, text: str, metadata: Mapping[str, Any]) -> str | None:
        """The language a chunk is analysed as (None: no language applies)."""
        ...

    def documents(
        self, texts: Sequence[str], languages: Sequence[str | None] | None = None
    ) -> list[SparseVector]:
        """One vector a text; `languages` (from `language_of`) saves identifying them again."""
        ...

    def query(self, text: str, language: str | None = None) -> SparseQuery:
        """The query's vector, in `language` when the caller names it."""
        ...

    def matches(self, query: SparseQuery, text: str, language: str | None) -> list[str]:
        """The words of `text` (analysed as `language`) whose terms are among the query's:
        what BM25 matched, for highlighting."""
        ...


#: Letters of scripts written without spaces between words, where a run of word
#: characters is a phrase, not a word: CJK ideographs, kana, Thai, Lao, Khmer, Myanmar.
_UNSPACED = re.compile(
    "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\u0e00-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f]"
)
_WORD = re.compile(r"\w+")
#: The longest word, in characters, looked for inside an unspaced run.
_UNSPACED_WORD = 4


def matched_words(text: str, query: SparseVector, analyse: Callable[[str], set[int]]) -> list[str]:
    """The words of `text` whose analysed terms meet the query's, each once, in text order.

    A run of an unspaced script is searched for words of up to four characters that analyse
    to a single matching term, since the tokenizer splits such runs itself.
    """
    wanted = set(query.indices)
    found: dict[str, None] = {}
    for word in dict.fromkeys(_WORD.findall(text)):
        if not _UNSPACED.search(word):
            if analyse(word) & wanted:
                found[word] = None
            continue
        for start in range(len(word)):
            for end in range(start + 1, min(len(word), start + _UNSPACED_WORD) + 1):
                piece = word[start:end]
                terms = analyse(piece)
                if len(terms) == 1 and terms & wanted:
                    found[piece] = None
    return list(found)


class QdrantBm25:
    """Qdrant's BM25 with its multilingual tokenizer. `language` picks the stopwords and the
    Snowball stemmer: one language for every text (a name such as `german`), `none` for
    neither, or `auto` for each text's own (see `ragrank/language.py`)."""

    def __init__(
        self, params: Bm25Params, language: str = "auto", *, query_confidence: float = 0.0
    ) -> None:
        self.params = params
        self._fixed = None if language == "auto" else language
        self._query_confidence = query_confidence
        self._models: dict[str | None, edge.Bm25] = {}
        self._lock = threading.Lock()
        # Key None: the fixed language's analyser, or, with `auto`, the one for languages
        # Qdrant has no analyser for.
        self._models[None] = self._build(self._fixed or "none")
        self.language = language
        self.detects = self._fixed is None
        recipe: list[Any] = ["bm25", language, params.k, params.b, params.avg_len]
        if self._fixed is None:
            recipe.insert(2, DETECTOR)
        self.recipe = json.dumps(recipe)

    def _build(self, language: str) -> edge.Bm25:
        options: dict[str, Any] = {"language": language}
        if language == "none":
            options = {"stopwords": edge.StopwordsSet(), "stemmer": edge.DisabledStemmer()}
        try:
            return edge.Bm25(
                edge.Bm25Config(
                    k=self.params.k,
                    b=self.params.b,
                    avg_len=self.params.avg_len,
                    tokenizer=edge.TokenizerType.Multilingual,
                    **options,
                )
            )
        except ValueError as exc:
            raise SettingsError(
                f"{env_name('bm25_language')}={language!r} is not a language Qdrant's BM25 "
                f"knows ({exc}); use auto, a language name such as english, german or french, "
                "or none"
            ) from None

    def _model(self, language: str | None) -> edge.Bm25:
        """The analyser of `language`: its own where Qdrant has one, else no stemming."""
        if self._fixed is not None:
            return self._models[None]
        key = language if language in ANALYSERS else None
        with self._lock:
            if key not in self._models:
                self._models[key] = self._build(ANALYSERS[key] if key else "none")
            return self._models[key]

    def language_of(self, text: str, metadata: Mapping[str, Any]) -> str | None:
        if self._fixed is not None:
            return CODES.get(self._fixed)
        return declared_language(metadata) or detect(text).language

    def documents(
        self, texts: Sequence[str], languages: Sequence[str | None] | None = None
    ) -> list[SparseVector]:
        if languages is None:
            languages = [self.language_of(text, {}) for text in texts]
        return [
            _sorted(self._model(language).embed_document(text))
            for text, language in zip(texts, languages, strict=True)
        ]

    def query(self, text: str, language: str | None = None) -> SparseQuery:
        if self._fixed is not None:
            return SparseQuery(_sorted(self._model(None).embed_query(text)), CODES.get(self._fixed))
        if language is not None:
            return SparseQuery(_sorted(self._model(language).embed_query(text)), language)
        guess = detect(text)
        first = guess.language
        if guess.confidence >= self._query_confidence or len(guess.ranked) < 2:
            return SparseQuery(_sorted(self._model(first).embed_query(text)), first)
        # Unsure: the terms of both likeliest languages, so the right one's stems are there.
        second = guess.ranked[1][0]
        terms = set(self._model(first).embed_query(text).indices)
        terms |= set(self._model(second).embed_query(text).indices)
        vector = SparseVector(tuple(sorted(terms)), (1.0,) * len(terms))
        return SparseQuery(vector, f"{first}+{second}")

    def matches(self, query: SparseQuery, text: str, language: str | None) -> list[str]:
        model = self._model(language)
        return matched_words(text, query.vector, lambda word: set(model.embed_query(word).indices))


class SubwordBm25:
    """BM25 over the vocabulary ids of a Hugging Face tokenizer (the embedding model's)."""

    def __init__(self, params: Bm25Params, tokenizer: Any, model_id: str) -> None:
        self._params = params
        self._tokenizer = tokenizer
        self.recipe = json.dumps(["subword", model_id, params.k, params.b, params.avg_len])
        self.detects = False

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        # Every term counts, however long the text: no truncation, and no warning about it.
        encoded = self._tokenizer(
            list(texts), add_special_tokens=False, truncation=False, verbose=False
        )
        return [list(ids) for ids in encoded["input_ids"]]

    def language_of(self, text: str, metadata: Mapping[str, Any]) -> str | None:
        return None

    def documents(
        self, texts: Sequence[str], languages: Sequence[str | None] | None = None
    ) -> list[SparseVector]:
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

    def query(self, text: str, language: str | None = None) -> SparseQuery:
        terms = sorted(set(self._ids([text])[0]))
        return SparseQuery(SparseVector(tuple(terms), (1.0,) * len(terms)))

    def matches(self, query: SparseQuery, text: str, language: str | None) -> list[str]:
        return matched_words(text, query.vector, lambda word: set(self._ids([word])[0]))


def _sorted(vector: edge.SparseVector) -> SparseVector:
    pairs = sorted(zip(vector.indices, vector.values, strict=True))
    return SparseVector(tuple(i for i, _ in pairs), tuple(float(v) for _, v in pairs))


def sparse_encoder(settings: Settings) -> SparseEncoder | None:
    """The encoder the settings name, or None for dense vectors only."""
    params = Bm25Params(k=settings.bm25_k, b=settings.bm25_b, avg_len=settings.bm25_avg_len)
    if settings.sparse == "none":
        return None
    if settings.sparse == "bm25":
        return QdrantBm25(
            params, settings.bm25_language, query_confidence=settings.bm25_query_confidence
        )
    from transformers import AutoTokenizer

    from ragrank.loading import load_model
    from ragrank.roles import EMBEDDING

    tokenizer = load_model(
        EMBEDDING.label,
        settings.embed_model,
        env_name(EMBEDDING.setting("model")),
        AutoTokenizer.from_pretrained,
    )
    return SubwordBm25(params, tokenizer, settings.embed_model)
