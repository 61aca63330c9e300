"""Which language a text is in, so that BM25 can stem and stop-word it as that language.

A document's own `lang` or `language` metadata wins; otherwise the language is identified from
the text by py3langid (a naive Bayes model over byte n-grams that ships inside the wheel:
offline, about 0.2 ms a passage on one core). Its 97 languages include close dialects that
Qdrant's BM25 analyses as their standard language (Wu and Cantonese as Chinese, Egyptian and
Moroccan Arabic as Arabic), so their probabilities are added to that language's before the
best is taken.

Languages are ISO 639-1 codes throughout; `ANALYSERS` maps the codes Qdrant's BM25 has
stopwords (and, for 17 of them, a Snowball stemmer) for to the names its configuration takes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache
from importlib.metadata import version
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from collections.abc import Mapping

    from py3langid.langid import LanguageIdentifier

#: The language names of Qdrant's BM25 (`qdrant_edge.Language`): the languages it has stopwords
#: for, and where Snowball has one, a stemmer.
Analyser = Literal[
    "arabic",
    "azerbaijani",
    "bengali",
    "catalan",
    "danish",
    "german",
    "greek",
    "english",
    "spanish",
    "basque",
    "finnish",
    "french",
    "hebrew",
    "hungarian",
    "indonesian",
    "italian",
    "japanese",
    "kazakh",
    "nepali",
    "dutch",
    "norwegian",
    "portuguese",
    "romanian",
    "russian",
    "slovene",
    "swedish",
    "tajik",
    "turkish",
    "chinese",
]
#: What `RAGRANK_BM25_LANGUAGE` takes: `auto` (each text's own language), one analyser for
#: every text, or `none` (no stopwords, no stemming).
Bm25Language = Literal[
    "auto",
    "none",
    Analyser,
]

#: ISO 639-1 code to its analyser (typed, so a name Qdrant lacks fails the type check).
ANALYSERS: dict[str, Analyser] = {
    "ar": "arabic",
    "az": "azerbaijani",
    "bn": "bengali",
    "ca": "catalan",
    "da": "danish",
    "de": "german",
    "el": "greek",
    "en": "english",
    "es": "spanish",
    "eu": "basque",
    "fi": "finnish",
    "fr": "french",
    "he": "hebrew",
    "hu": "hungarian",
    "id": "indonesian",
    "it": "italian",
    "ja": "japanese",
    "kk": "kazakh",
    "ne": "nepali",
    "nl": "dutch",
    "no": "norwegian",
    "pt": "portuguese",
    "ro": "romanian",
    "ru": "russian",
    "sl": "slovene",
    "sv": "swedish",
    "tg": "tajik",
    "tr": "turkish",
    "zh": "chinese",
}

#: Qdrant's language name back to its ISO 639-1 code.
CODES: dict[str, str] = {name: code for code, name in ANALYSERS.items()}
if set(CODES) != set(get_args(Analyser)):
    raise ImportError("every analyser needs its ISO 639-1 code in ANALYSERS")

#: Dialects the identifier tells apart that BM25 analyses as one language.
_DIALECTS = {"wuu": "zh", "yue": "zh", "arz": "ar", "ary": "ar", "nn": "no"}

#: What the stamp records of the identifier: a new model or release re-indexes.
DETECTOR = f"py3langid-{version('py3langid')}"

_lock = threading.Lock()


@dataclass(frozen=True)
class Guess:
    """The identifier's best languages, most probable first, with probabilities summing to at
    most 1 (dialects merged into their language)."""

    ranked: tuple[tuple[str, float], ...]

    @property
    def language(self) -> str:
        return self.ranked[0][0]

    @property
    def confidence(self) -> float:
        return self.ranked[0][1]


@cache
def _identifier() -> LanguageIdentifier:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    with _lock:
        return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def detect(text: str, top: int = 3) -> Guess:
    """The `top` most probable languages of `text`; an empty or symbol-only text gets
    whatever the model's prior favours, at a low confidence."""
    merged: dict[str, float] = {}
    for label, probability in _identifier().rank(text):
        code = _DIALECTS.get(label, label)
        merged[code] = merged.get(code, 0.0) + float(probability)
    ranked = sorted(merged.items(), key=lambda item: -item[1])[:top]
    return Guess(tuple((code, round(p, 6)) for code, p in ranked))


def known_language(value: str) -> str | None:
    """`value` as an ISO 639-1 code if it names a language the identifier or BM25 knows
    (a code such as `de`, a region-tagged one such as `pt-BR`, or a name such as `german`)."""
    name = value.strip().lower().replace("_", "-")
    if name in CODES:
        return CODES[name]
    code = name.split("-", 1)[0]
    code = _DIALECTS.get(code, code)
    if code in ANALYSERS or code in _identifier().nb_classes:
        return code
    return None


def primary_subtag(value: str) -> str:
    """The language part of a tag such as `pt-BR` or `zh_Hant`, lowercased."""
    return value.strip().lower().replace("_", "-").split("-", 1)[0]


def declared_language(metadata: Mapping[str, Any]) -> str | None:
    """The language a document's metadata names (`lang`, else `language`), when it is one
    `known_language` recognises; an unrecognised value is ignored, and the text decides."""
    for key in ("lang", "language"):
        value = metadata.get(key)
        if isinstance(value, str) and (code := known_language(value)) is not None:
            return code
    return None
