"""Language-aware BM25: the identifier on short texts of each script, a document's own
language over identification, a query's language choosing its stemmer, mixed-language
collections through Qdrant Edge's BM25, old collections, highlighting and merged eval qrels."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pytest

from indexing.pipeline import with_language
from ragrank.beir import BeirDataset, merge_beir
from ragrank.documents import Chunk, Document
from ragrank.language import declared_language, detect, known_language
from ragrank.sparse import Bm25Params, QdrantBm25
from ragrank.store import EdgeStore, Store
from ragrank.store.maintenance import indexed_sparse_encoder

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

PARAMS = Bm25Params(avg_len=8.0)

#: Question-length texts, one per script family the identifier meets in XQuAD-R and beyond.
SHORT_TEXTS = {
    "ru": "Где находится кошка?",
    "de": "Wo liegt die Stadt Berlin?",
    "en": "Where is the capital of France?",
    "es": "¿Dónde está la ciudad de Madrid?",
    "tr": "İstanbul nerede bulunuyor?",
    "vi": "Hà Nội là thủ đô của Việt Nam",
    "zh": "北京是中国的首都吗？",
    "ja": "東京はどこにありますか",
    "ar": "مدينة القاهرة عاصمة مصر",
    "el": "Πού βρίσκεται η Αθήνα;",
    "th": "กรุงเทพอยู่ที่ไหน",
    "ko": "서울은 어디에 있습니까",
}


@pytest.mark.parametrize(("language", "text"), SHORT_TEXTS.items())
def test_short_texts_are_identified_in_every_script(language: str, text: str):
    assert detect(text).language == language


def test_one_word_is_too_little_to_identify():
    """The failure mode the docs name: a lone word of a shared script is a guess, at low
    confidence, so a request should name its language."""
    guess = detect("кошка")
    assert guess.confidence < 0.5


def test_dialects_count_as_their_language():
    # Wu and Standard Chinese share their characters: their probabilities are added.
    guess = detect("他们在上海的工厂工作了很多年")
    assert guess.language == "zh" and guess.confidence > 0.9


def test_language_names_and_codes_are_read_alike():
    assert known_language("de") == known_language("German") == known_language("de-AT") == "de"
    assert known_language("pt_BR") == "pt"
    assert known_language("klingon") is None
    assert declared_language({"language": "russian"}) == "ru"
    assert declared_language({"lang": "xx-unknown", "language": "fr"}) == "fr"
    assert declared_language({"lang": 3}) is None


def _analysed(language: str, text: str) -> set[int]:
    return set(QdrantBm25(PARAMS, language).documents([text])[0].indices)


def test_a_metadata_language_beats_identification():
    encoder = QdrantBm25(PARAMS)
    text = "The children were playing football in the gardens"
    assert encoder.language_of(text, {}) == "en"
    assert encoder.language_of(text, {"lang": "de"}) == "de"
    (vector,) = encoder.documents([text], ["de"])
    assert set(vector.indices) == _analysed("german", text) != _analysed("english", text)
    chunk = Chunk(doc_id="d", chunk_index=0, text=text)
    assert with_language(chunk, "en").metadata == {"lang": "en"}
    declared = Chunk(doc_id="d", chunk_index=0, text=text, metadata={"language": "German"})
    assert with_language(declared, "de").metadata == {"language": "German"}


def _index(store: Store, texts: dict[str, str], encoder: QdrantBm25) -> None:
    store.ensure_collection(4)
    chunks = [Chunk(doc_id=doc_id, chunk_index=0, text=text) for doc_id, text in texts.items()]
    vectors = np.random.default_rng(0).normal(size=(len(chunks), 4)).astype(np.float32)
    store.upsert(chunks, vectors, sparse=encoder.documents([c.passage for c in chunks]))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = EdgeStore(tmp_path / "q", "c")
    yield store
    store.close()


MIXED = {
    "ru": "Дети долго играли во дворе с маленькими кошками и собаками",
    "de": "Die Kinder spielten lange im Garten mit den kleinen Katzen",
    "en": "The children were playing for hours with the little kittens",
    "fr": "Les enfants jouaient longtemps dans le jardin avec les chatons",
}


def test_the_russian_inflection_matches_only_with_auto(tmp_path: Path):
    """`кошками` (with cats) in the document, `кошка` (a cat) in the query: the Russian
    stemmer makes them one term; the English one leaves them apart."""
    query = "Где играла маленькая кошка?"
    found = {}
    for language in ("auto", "english"):
        store = EdgeStore(tmp_path / language, "c")
        encoder = QdrantBm25(PARAMS, language)
        _index(store, MIXED, encoder)
        hits = store.search(None, 5, sparse=encoder.query(query).vector)
        found[language] = [hit.chunk.doc_id for hit in hits]
        store.close()
    assert found == {"auto": ["ru"], "english": []}


def test_a_mixed_collection_answers_each_language_by_its_own_stems(store: Store):
    encoder = QdrantBm25(PARAMS)
    assert [encoder.language_of(text, {}) for text in MIXED.values()] == list(MIXED)
    _index(store, MIXED, encoder)
    queries = {
        "ru": ("Где играли дети с кошкой?", "ru"),
        "de": ("Wo spielt ein Kind mit einer Katze?", "de"),
        "en": ("Who played with a kitten?", "en"),
    }
    for expected, (query, language) in queries.items():
        analysed = encoder.query(query)
        assert analysed.language == language
        hits = store.search(None, 5, sparse=analysed.vector)
        assert hits and hits[0].chunk.doc_id == expected, query


def test_a_named_query_language_is_used_as_given():
    encoder = QdrantBm25(PARAMS)
    analysed = encoder.query("кошки", "ru")
    assert analysed.language == "ru"
    assert set(analysed.vector.indices) == set(
        QdrantBm25(PARAMS, "russian").query("кошки").vector.indices
    )


def test_an_unsure_query_carries_the_terms_of_its_two_likeliest_languages():
    unsure = QdrantBm25(PARAMS, query_confidence=1.0)
    query = "Wo spielten die Kinder?"
    first, second = (code for code, _ in detect(query).ranked[:2])
    analysed = unsure.query(query)
    assert analysed.language == f"{first}+{second}"
    both = set(unsure.query(query, first).vector.indices) | set(
        unsure.query(query, second).vector.indices
    )
    assert set(analysed.vector.indices) == both
    assert QdrantBm25(PARAMS).query(query).language == "de"


def test_matched_words_are_whole_words_by_stem():
    encoder = QdrantBm25(PARAMS)
    text = "In den Niederlanden oder in Deutschland spielen Kinder mit Katzen."
    query = encoder.query("Wo spielen der Kind und die Katze", "de")
    # Stems, not substrings: "Kinder" and "Katzen" by their stems; "der", a stopword, is not
    # marked, nor found inside "Niederlanden" or "oder".
    assert encoder.matches(query, text, "de") == ["spielen", "Kinder", "Katzen"]
    chinese = encoder.matches(encoder.query("北京的天气", "zh"), "今天北京天气很好", "zh")
    assert "北京" in chinese and "天气" in chinese and "今天" not in chinese


def test_an_old_fixed_language_collection_keeps_its_language(
    store: Store, caplog: pytest.LogCaptureFixture
):
    old = QdrantBm25(PARAMS, "english")
    _index(store, MIXED, old)
    store.add_sparse(old)  # stamps every point with the fixed recipe, as indexing did
    current = QdrantBm25(PARAMS)
    with caplog.at_level(logging.WARNING):
        chosen = indexed_sparse_encoder(store, current)
    assert isinstance(chosen, QdrantBm25) and chosen.language == "english"
    assert "re-indexed" in caplog.text and "add-sparse" in caplog.text
    # Recomputed with the new recipe, the collection answers in each text's language, and
    # each chunk records the language it was analysed in.
    assert store.add_sparse(current) == len(MIXED)
    assert indexed_sparse_encoder(store, current) is current
    hits = store.search(None, 5, sparse=current.query("Где играла маленькая кошка?").vector)
    assert [hit.chunk.doc_id for hit in hits] == ["ru"]
    assert hits[0].chunk.metadata == {"lang": "ru"}


def _part(name: str, qids: list[str]) -> BeirDataset:
    """A folder whose i-th query is answered by its i-th sentence."""
    return BeirDataset(
        name=name,
        corpus={f"s{i}": Document(doc_id=f"s{i}", text=q) for i, q in enumerate(qids)},
        queries={q: f"{name} {q}" for q in qids},
        qrels={q: {f"s{i}": 1} for i, q in enumerate(qids)},
        query_languages=dict.fromkeys(qids, name),
    )


def test_merged_qrels_in_both_relevance_modes():
    de, en = _part("de", ["q1", "q2"]), _part("en", ["q1", "q3"])
    same = merge_beir([de, en], "same")
    assert set(same.corpus) == {"de/s0", "de/s1", "en/s0", "en/s1"}
    assert same.corpus["de/s1"].doc_id == "de/s1"
    assert same.qrels["de/q1"] == {"de/s0": 1}
    assert same.query_languages == {"de/q1": "de", "de/q2": "de", "en/q1": "en", "en/q3": "en"}
    parallel = merge_beir([de, en], "any")
    # q1 is in both folders: each translation's answer counts; q2 and q3 have only their own.
    assert parallel.qrels["de/q1"] == parallel.qrels["en/q1"] == {"de/s0": 1, "en/s0": 1}
    assert parallel.qrels["de/q2"] == {"de/s1": 1}
    assert parallel.qrels["en/q3"] == {"en/s1": 1}
    assert parallel.parts == (de, en)
