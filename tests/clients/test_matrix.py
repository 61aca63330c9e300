"""The client compatibility matrix: LiteLLM, LangChain, LlamaIndex and Haystack, each through
every provider of theirs whose wire format ragrank serves, against a real `ragrank serve`.

A working cell reranks (the best `TOP_N` in order, each score its own document's, documents
returned when asked) or embeds (each vector ragrank's own for that text and role), and a 4xx
from ragrank surfaces as the client's own error. A cell that cannot work shows why, and its
workaround is tested. `docs/clients.md` holds the table these cells render to.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from tests.clients.conftest import (
    KEY,
    MAX_DOCUMENT_CHARS,
    MAX_QUERY_CHARS,
    SECOND_RERANKER,
    Network,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import httpx

QUERY = "Where does the Rhine flow into the sea?"
DOCS = [
    "The Rhine flows into the North Sea near Rotterdam.",
    "Paris is the capital of France.",
    "A cross-encoder reads the query and the document together.",
    "The Danube ends in the Black Sea.",
    "Rotterdam has the largest port in Europe.",
    "Tea is grown on the slopes of Darjeeling.",
]
TOP_N = 3
TEXTS = ["The Rhine flows into the North Sea.", "Tea grows in Darjeeling."]
LONG_QUERY = "q" * (MAX_QUERY_CHARS + 1)
LONG_TEXT = "t" * (MAX_DOCUMENT_CHARS + 1)
QUERY_LIMIT = "RAGRANK_MAX_QUERY_CHARS"
TEXT_LIMIT = "RAGRANK_MAX_DOCUMENT_CHARS"
JINA_HOST = re.escape("api.jina.ai")


@dataclass(frozen=True)
class Cell:
    framework: str
    provider: str
    operation: str
    works: bool
    note: str


CELLS: list[Cell] = []


def cell(
    framework: str, provider: str, operation: str, *, works: bool = True, note: str = ""
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a test as the one behind a cell of the matrix."""

    def register(test: Callable[..., None]) -> Callable[..., None]:
        CELLS.append(Cell(framework, provider, operation, works, note))
        return test

    return register


def cells(framework: str, operation: str, providers: dict[str, str]) -> list[str]:
    """Register the cells one parametrized test stands behind (provider: note); their
    providers, to parametrize it with."""
    CELLS.extend(Cell(framework, p, operation, True, note) for p, note in providers.items())
    return list(providers)


# -- ragrank's own answers ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def truth(http: httpx.Client) -> dict[str, float]:
    """Each document's relevance score, from ragrank's `/v1/rerank`."""
    answer = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
    assert answer.status_code == 200, answer.text
    scores = {DOCS[r["index"]]: r["relevance_score"] for r in answer.json()["results"]}
    ordered = sorted(scores.values())
    # Distinct scores, or a client that mixed documents up could still pass.
    assert min(b - a for a, b in itertools.pairwise(ordered)) > 1e-4, scores
    return scores


@pytest.fixture(scope="session")
def vectors(http: httpx.Client) -> Callable[[Sequence[str], str], np.ndarray]:
    """ragrank's own vectors of texts embedded as `query` or `passage`."""

    def embed(texts: Sequence[str], role: str) -> np.ndarray:
        answer = http.post("/v1/embeddings", json={"input": list(texts), "input_type": role})
        assert answer.status_code == 200, answer.text
        return np.array([d["embedding"] for d in answer.json()["data"]])

    return embed


def assert_ranked(got: Sequence[tuple[str, float]], truth: dict[str, float]) -> None:
    """`got` is the best TOP_N documents best first, each with its own score."""
    assert len(got) == TOP_N, got
    best = sorted(truth.values(), reverse=True)[:TOP_N]
    for (text, score), expected in zip(got, best, strict=True):
        assert score == pytest.approx(truth[text], abs=1e-4), (text, score)
        assert score == pytest.approx(expected, abs=1e-4), got


def assert_vectors(
    got: Any, texts: Sequence[str], role: str, vectors: Callable[..., np.ndarray]
) -> None:
    """`got` holds ragrank's vectors of `texts` as `role`, and not those of the other role."""
    got = np.asarray(got, dtype=np.float64)
    np.testing.assert_allclose(got, vectors(texts, role), atol=1e-4)
    other = vectors(texts, "passage" if role == "query" else "query")
    assert not np.allclose(got, other, atol=1e-3)


# -- LiteLLM -----------------------------------------------------------------------------------


def _litellm_rerank(model: str, api_base: str, query: str = QUERY) -> Any:
    import litellm

    return litellm.rerank(
        model=model,
        query=query,
        documents=DOCS,
        top_n=TOP_N,
        return_documents=True,
        api_base=api_base,
        api_key=KEY,
        num_retries=0,
    )


LITELLM_RERANKERS = {
    "Cohere v2": ("cohere/rerank-v3.5", ""),
    "Cohere v1": ("cohere/rerank-english-v3.0", "/v1/rerank"),
    "Infinity": ("infinity/bge-reranker-v2-m3", ""),
    "Jina": ("jina_ai/jina-reranker-v2-base-multilingual", ""),
    "Hugging Face (TEI)": ("huggingface/BAAI/bge-reranker-v2-m3", ""),
}


@pytest.mark.parametrize(
    "provider",
    cells(
        "LiteLLM",
        "rerank",
        {
            "Cohere v2": "",
            "Cohere v1": "`api_base` ends in `/v1/rerank`",
            "Infinity": "",
            "Jina": "",
            "Hugging Face (TEI)": "LiteLLM fetches the model's `config.json` from huggingface.co "
            "to price each call; offline that fails quietly",
        },
    ),
)
def test_litellm_reranks(
    provider: str, ragrank: str, truth: dict[str, float], expects_a_vendor_host: Network
):
    import litellm

    model, path = LITELLM_RERANKERS[provider]
    answer = _litellm_rerank(model, ragrank + path)
    got = [(DOCS[r["index"]], r["relevance_score"]) for r in answer.results]
    assert_ranked(got, truth)
    assert [r["document"]["text"] for r in answer.results] == [text for text, _ in got]
    with pytest.raises(litellm.BadRequestError, match=QUERY_LIMIT):
        _litellm_rerank(model, ragrank + path, query=LONG_QUERY)
    _only_huggingface_pricing(provider, expects_a_vendor_host)


@cell(
    "LiteLLM",
    "Cohere v2",
    "rerank, a second model by name",
    note='`model="cohere/wide"` picks the server\'s reranker named `wide` '
    "(`RAGRANK_RERANK_MODELS`)",
)
def test_litellm_picks_a_second_reranker_by_name(
    ragrank: str, http: httpx.Client, truth: dict[str, float]
):
    answer = http.post(
        "/v1/rerank", json={"query": QUERY, "documents": DOCS, "model": SECOND_RERANKER}
    )
    assert answer.status_code == 200, answer.text
    second = {DOCS[r["index"]]: r["relevance_score"] for r in answer.json()["results"]}
    assert second != pytest.approx(truth, abs=1e-3), "the second reranker scores its own way"
    picked = _litellm_rerank(f"cohere/{SECOND_RERANKER}", ragrank)
    assert_ranked([(DOCS[r["index"]], r["relevance_score"]) for r in picked.results], second)


def _only_huggingface_pricing(provider: str, network: Network) -> None:
    """LiteLLM prices a `huggingface/` call by the model's config on huggingface.co (offline
    the look-up fails quietly); no other provider reaches past the loopback."""
    expected = {"huggingface.co"} if provider == "Hugging Face (TEI)" else set()
    assert set(network.refused) <= expected, network.refused


LITELLM_EMBEDDERS = {
    "OpenAI": ("openai/text-embedding-3-small", "/v1", {}, "passage"),
    "Infinity": ("infinity/multilingual-e5-base", "", {}, "passage"),
    "Jina": ("jina_ai/jina-embeddings-v3", "/v1", {}, "passage"),
    "Cohere v2": ("cohere/embed-v4.0", "/v2/embed", {"input_type": "search_query"}, "query"),
    "Hugging Face (TEI)": (
        "huggingface/intfloat/multilingual-e5-base",
        "/embed",
        {"input_type": "feature-extraction"},
        "passage",
    ),
}


@pytest.mark.parametrize(
    "provider",
    cells(
        "LiteLLM",
        "embeddings",
        {
            "OpenAI": "`api_base` is `…/v1`",
            "Infinity": "",
            "Jina": "`api_base` is `…/v1`",
            "Cohere v2": "`api_base` is the full URL, `…/v2/embed`; `input_type` picks the role",
            "Hugging Face (TEI)": '`api_base` is `…/embed`; `input_type="feature-extraction"` '
            "spares a look-up of the task on huggingface.co; pricing still fetches its config",
        },
    ),
)
def test_litellm_embeds(
    provider: str,
    ragrank: str,
    vectors: Callable[..., np.ndarray],
    expects_a_vendor_host: Network,
):
    import litellm

    model, path, extra, role = LITELLM_EMBEDDERS[provider]

    def embed(texts: list[str]) -> Any:
        return litellm.embedding(
            model=model, input=texts, api_base=ragrank + path, api_key=KEY, **extra
        )

    answer = embed(TEXTS)
    assert_vectors([d["embedding"] for d in answer.data], TEXTS, role, vectors)
    with pytest.raises(litellm.BadRequestError, match=TEXT_LIMIT):
        embed([LONG_TEXT])
    _only_huggingface_pricing(provider, expects_a_vendor_host)


# -- LangChain ---------------------------------------------------------------------------------


def _langchain_documents() -> list[Any]:
    from langchain_core.documents import Document

    return [Document(page_content=text) for text in DOCS]


def _compressed(documents: Sequence[Any]) -> list[tuple[str, float]]:
    return [(d.page_content, d.metadata["relevance_score"]) for d in documents]


@cell("LangChain", "Cohere v2", "rerank")
def test_langchain_cohere_reranks(ragrank: str, truth: dict[str, float]):
    import cohere
    from langchain_cohere import CohereRerank

    reranker = CohereRerank(model="rerank-v3.5", base_url=ragrank, cohere_api_key=KEY, top_n=TOP_N)
    assert_ranked(_compressed(reranker.compress_documents(_langchain_documents(), QUERY)), truth)
    with pytest.raises(cohere.BadRequestError, match=QUERY_LIMIT):
        reranker.compress_documents(_langchain_documents(), LONG_QUERY)


@cell(
    "LangChain",
    "Jina",
    "rerank",
    works=False,
    note="`JinaRerank` posts to api.jina.ai whatever it is given; set the module's "
    "`JINA_API_URL` to `…/v1/rerank`, or use `CohereRerank`",
)
def test_langchain_jina_reranks_once_pointed_at_ragrank(
    ragrank: str,
    truth: dict[str, float],
    expects_a_vendor_host: Network,
    monkeypatch: pytest.MonkeyPatch,
):
    from langchain_community.document_compressors import jina_rerank

    reranker = jina_rerank.JinaRerank(jina_api_key=KEY, top_n=TOP_N)
    with pytest.raises(Exception, match=JINA_HOST):
        reranker.compress_documents(_langchain_documents(), QUERY)
    assert "api.jina.ai" in expects_a_vendor_host.refused
    monkeypatch.setattr(jina_rerank, "JINA_API_URL", f"{ragrank}/v1/rerank")
    assert_ranked(_compressed(reranker.compress_documents(_langchain_documents(), QUERY)), truth)
    with pytest.raises(Exception, match=QUERY_LIMIT):
        reranker.compress_documents(_langchain_documents(), LONG_QUERY)


@cell("LangChain", "Cohere v1", "embeddings", note="`embed_query` embeds a query")
def test_langchain_cohere_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    import cohere
    from langchain_cohere import CohereEmbeddings

    embedder = CohereEmbeddings(
        model="embed-v4.0", base_url=ragrank, cohere_api_key=KEY, max_retries=0
    )
    assert_vectors([embedder.embed_query(TEXTS[0])], TEXTS[:1], "query", vectors)
    assert_vectors(embedder.embed_documents(TEXTS), TEXTS, "passage", vectors)
    with pytest.raises(cohere.BadRequestError, match=TEXT_LIMIT):
        embedder.embed_documents([LONG_TEXT])


@cell(
    "LangChain",
    "OpenAI",
    "embeddings",
    note="`check_embedding_ctx_length=False`: otherwise it sends tiktoken's token ids",
)
def test_langchain_openai_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    import openai
    from langchain_openai import OpenAIEmbeddings

    embedder = OpenAIEmbeddings(
        model="text-embedding-3-small",
        base_url=f"{ragrank}/v1",
        api_key=KEY,
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    assert_vectors(embedder.embed_documents(TEXTS), TEXTS, "passage", vectors)
    with pytest.raises(openai.BadRequestError, match=TEXT_LIMIT):
        embedder.embed_documents([LONG_TEXT])


@cell(
    "LangChain",
    "Infinity",
    "embeddings",
    note="`InfinityEmbeddings` sends no API key: a server with keys answers it 401",
)
def test_langchain_infinity_embeds(keyless: str, ragrank: str, vectors: Callable[..., np.ndarray]):
    from langchain_community.embeddings import InfinityEmbeddings

    assert_vectors(
        InfinityEmbeddings(model="e5", infinity_api_url=keyless).embed_documents(TEXTS),
        TEXTS,
        "passage",
        vectors,
    )
    with pytest.raises(Exception, match="401"):
        InfinityEmbeddings(model="e5", infinity_api_url=ragrank).embed_documents(TEXTS)
    with pytest.raises(Exception, match=TEXT_LIMIT):
        InfinityEmbeddings(model="e5", infinity_api_url=keyless).embed_documents([LONG_TEXT])


@cell(
    "LangChain",
    "Jina",
    "embeddings",
    works=False,
    note="`JinaEmbeddings` posts to api.jina.ai whatever it is given; set the module's "
    "`JINA_API_URL` to `…/v1/embeddings`, or use `OpenAIEmbeddings`",
)
def test_langchain_jina_embeds_once_pointed_at_ragrank(
    ragrank: str,
    vectors: Callable[..., np.ndarray],
    expects_a_vendor_host: Network,
    monkeypatch: pytest.MonkeyPatch,
):
    from langchain_community.embeddings import jina

    embedder = jina.JinaEmbeddings(jina_api_key=KEY, model_name="jina-embeddings-v3")
    with pytest.raises(Exception, match=JINA_HOST):
        embedder.embed_documents(TEXTS)
    assert "api.jina.ai" in expects_a_vendor_host.refused
    monkeypatch.setattr(jina, "JINA_API_URL", f"{ragrank}/v1/embeddings")
    assert_vectors(embedder.embed_documents(TEXTS), TEXTS, "passage", vectors)


@cell(
    "LangChain",
    "Hugging Face (TEI)",
    "embeddings",
    works=False,
    note="`HuggingFaceEndpointEmbeddings` refuses a URL for `model`; use `OpenAIEmbeddings` "
    "at `…/v1`, which TEI serves too",
)
def test_langchain_huggingface_refuses_a_url():
    from langchain_huggingface import HuggingFaceEndpointEmbeddings
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not a URL"):
        HuggingFaceEndpointEmbeddings(model="http://127.0.0.1:8000")


# -- LlamaIndex --------------------------------------------------------------------------------


def _llama_nodes() -> list[Any]:
    from llama_index.core.schema import NodeWithScore, TextNode

    return [NodeWithScore(node=TextNode(text=text)) for text in DOCS]


def _reranked(reranker: Any, query: str = QUERY) -> list[tuple[str, float]]:
    nodes = reranker.postprocess_nodes(_llama_nodes(), query_str=query)
    return [(n.node.text, n.score) for n in nodes]


@cell("LlamaIndex", "Cohere v2", "rerank")
def test_llamaindex_cohere_reranks(ragrank: str, truth: dict[str, float]):
    import cohere
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    reranker = CohereRerank(api_key=KEY, base_url=ragrank, top_n=TOP_N, model="rerank-v3.5")
    assert_ranked(_reranked(reranker), truth)
    with pytest.raises(cohere.BadRequestError, match=QUERY_LIMIT):
        _reranked(reranker, LONG_QUERY)


@cell("LlamaIndex", "Jina", "rerank", note="`base_url` is `…/v1`")
def test_llamaindex_jina_reranks(ragrank: str, truth: dict[str, float]):
    from llama_index.postprocessor.jinaai_rerank import JinaRerank

    reranker = JinaRerank(api_key=KEY, base_url=f"{ragrank}/v1", top_n=TOP_N)
    assert_ranked(_reranked(reranker), truth)
    with pytest.raises(RuntimeError, match=QUERY_LIMIT):
        _reranked(reranker, LONG_QUERY)


@cell(
    "LlamaIndex",
    "text-embeddings-inference",
    "rerank",
    note='`auth_token` goes out as given: `"Bearer KEY"`. The client reads no status: a 4xx '
    "surfaces as an `AssertionError`, without ragrank's message",
)
def test_llamaindex_tei_reranks(ragrank: str, truth: dict[str, float]):
    from llama_index.postprocessor.tei_rerank import TextEmbeddingInference

    reranker = TextEmbeddingInference(
        base_url=ragrank, top_n=TOP_N, auth_token=f"Bearer {KEY}", model_name="bge"
    )
    assert_ranked(_reranked(reranker), truth)
    with pytest.raises(AssertionError):
        _reranked(reranker, LONG_QUERY)


@cell("LlamaIndex", "OpenAI", "embeddings")
def test_llamaindex_openai_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    import openai
    from llama_index.embeddings.openai import OpenAIEmbedding

    embedder = OpenAIEmbedding(api_key=KEY, api_base=f"{ragrank}/v1", max_retries=0)
    assert_vectors(embedder.get_text_embedding_batch(TEXTS), TEXTS, "passage", vectors)
    with pytest.raises(openai.BadRequestError, match=TEXT_LIMIT):
        embedder.get_text_embedding_batch([LONG_TEXT])


@cell("LlamaIndex", "Cohere v2", "embeddings", note="queries and texts by their role")
def test_llamaindex_cohere_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    import cohere
    from llama_index.embeddings.cohere import CohereEmbedding

    embedder = CohereEmbedding(api_key=KEY, base_url=ragrank, model_name="embed-v4.0")
    assert_vectors([embedder.get_query_embedding(TEXTS[0])], TEXTS[:1], "query", vectors)
    assert_vectors(embedder.get_text_embedding_batch(TEXTS), TEXTS, "passage", vectors)
    with pytest.raises(cohere.BadRequestError, match=TEXT_LIMIT):
        embedder.get_text_embedding_batch([LONG_TEXT])


@cell(
    "LlamaIndex",
    "Jina",
    "embeddings",
    works=False,
    note="`JinaEmbedding` 0.7 does not pass `base_url` on and posts to api.jina.ai; use "
    "`OpenAIEmbedding` at `…/v1`",
)
def test_llamaindex_jina_embedding_calls_its_vendor(expects_a_vendor_host: Network, ragrank: str):
    from llama_index.embeddings.jinaai import JinaEmbedding

    embedder = JinaEmbedding(api_key=KEY, base_url=f"{ragrank}/v1")
    with pytest.raises(Exception, match=JINA_HOST):
        embedder.get_query_embedding(TEXTS[0])
    assert "api.jina.ai" in expects_a_vendor_host.refused


@cell(
    "LlamaIndex",
    "text-embeddings-inference",
    "embeddings",
    note="passages only (TEI's clients name no role). The client reads no status: a 4xx "
    "surfaces as pydantic's `ValidationError`, without ragrank's message",
)
def test_llamaindex_tei_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
    from pydantic import ValidationError

    embedder = TextEmbeddingsInference(model_name="e5", base_url=ragrank, auth_token=KEY)
    assert_vectors(embedder.get_text_embedding_batch(TEXTS), TEXTS, "passage", vectors)
    with pytest.raises(ValidationError):
        embedder.get_text_embedding_batch([LONG_TEXT])


@cell(
    "LlamaIndex",
    "Hugging Face (TEI)",
    "embeddings",
    note="`model_name` is ragrank's URL. Use the async methods in one event loop: the sync ones "
    "start a loop per call on one shared client, and the second call fails (against TEI too)",
)
def test_llamaindex_huggingface_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    from huggingface_hub.errors import HfHubHTTPError
    from llama_index.embeddings.huggingface_api import HuggingFaceInferenceAPIEmbedding

    embedder = HuggingFaceInferenceAPIEmbedding(model_name=ragrank, token=KEY)

    async def embed_then_fail() -> list[float]:
        embedding = await embedder.aget_text_embedding(TEXTS[0])
        with pytest.raises(HfHubHTTPError, match=TEXT_LIMIT):
            await embedder.aget_text_embedding(LONG_TEXT)
        return embedding

    assert_vectors([asyncio.run(embed_then_fail())], TEXTS[:1], "passage", vectors)
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        embedder.get_text_embedding(TEXTS[0])  # the sync method, in a new loop


# -- Haystack ----------------------------------------------------------------------------------


def _haystack_documents() -> list[Any]:
    from haystack import Document

    return [Document(content=text) for text in DOCS]


def _ranked(ranker: Any, query: str = QUERY) -> list[tuple[str, float]]:
    documents = ranker.run(query=query, documents=_haystack_documents())["documents"]
    return [(d.content, d.score) for d in documents]


def _secret() -> Any:
    from haystack.utils import Secret

    return Secret.from_token(KEY)


@cell("Haystack", "Cohere v2", "rerank")
def test_haystack_cohere_ranks(ragrank: str, truth: dict[str, float]):
    import cohere
    from haystack_integrations.components.rankers.cohere import CohereRanker

    ranker = CohereRanker(api_key=_secret(), api_base_url=ragrank, top_k=TOP_N)
    assert_ranked(_ranked(ranker), truth)
    with pytest.raises(cohere.BadRequestError, match=QUERY_LIMIT):
        _ranked(ranker, LONG_QUERY)


@cell("Haystack", "Jina", "rerank", note="`base_url` is `…/v1/rerank`")
def test_haystack_jina_ranks(ragrank: str, truth: dict[str, float]):
    from haystack_integrations.components.rankers.jina import JinaRanker

    ranker = JinaRanker(api_key=_secret(), base_url=f"{ragrank}/v1/rerank", top_k=TOP_N)
    assert_ranked(_ranked(ranker), truth)
    with pytest.raises(RuntimeError, match=QUERY_LIMIT):
        _ranked(ranker, LONG_QUERY)


@cell(
    "Haystack",
    "text-embeddings-inference",
    "rerank",
    note="a 4xx surfaces as a `RuntimeError` naming the status, without ragrank's message",
)
def test_haystack_tei_ranks(ragrank: str, truth: dict[str, float]):
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker

    ranker = HuggingFaceTEIRanker(url=ragrank, top_k=TOP_N, token=_secret())
    assert_ranked(_ranked(ranker), truth)
    with pytest.raises(RuntimeError, match="400"):
        _ranked(ranker, LONG_QUERY)


@cell("Haystack", "OpenAI", "embeddings")
def test_haystack_openai_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    import openai
    from haystack.components.embedders import OpenAITextEmbedder

    embedder = OpenAITextEmbedder(api_key=_secret(), api_base_url=f"{ragrank}/v1", max_retries=0)
    embedding = embedder.run(text=TEXTS[0])["embedding"]
    assert_vectors([embedding], TEXTS[:1], "passage", vectors)
    with pytest.raises(openai.BadRequestError, match=TEXT_LIMIT):
        embedder.run(text=LONG_TEXT)


@cell("Haystack", "Cohere v2", "embeddings", note="the text embedder embeds queries")
def test_haystack_cohere_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    import cohere
    from haystack_integrations.components.embedders.cohere import (
        CohereDocumentEmbedder,
        CohereTextEmbedder,
    )

    query = CohereTextEmbedder(api_key=_secret(), api_base_url=ragrank)
    assert_vectors([query.run(text=TEXTS[0])["embedding"]], TEXTS[:1], "query", vectors)
    documents = CohereDocumentEmbedder(api_key=_secret(), api_base_url=ragrank)
    embedded = documents.run(documents=[_document(text) for text in TEXTS])["documents"]
    assert_vectors([d.embedding for d in embedded], TEXTS, "passage", vectors)
    with pytest.raises(cohere.BadRequestError, match=TEXT_LIMIT):
        query.run(text=LONG_TEXT)


def _document(text: str) -> Any:
    from haystack import Document

    return Document(content=text)


@cell(
    "Haystack",
    "Jina",
    "embeddings",
    note="`base_url` is `…/v1/embeddings`; `task` picks the role",
)
def test_haystack_jina_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    from haystack_integrations.components.embedders.jina import JinaTextEmbedder

    embedder = JinaTextEmbedder(
        api_key=_secret(), base_url=f"{ragrank}/v1/embeddings", task="retrieval.query"
    )
    assert_vectors([embedder.run(text=TEXTS[0])["embedding"]], TEXTS[:1], "query", vectors)
    with pytest.raises(RuntimeError, match=TEXT_LIMIT):
        embedder.run(text=LONG_TEXT)


@cell("Haystack", "Hugging Face (TEI)", "embeddings", note="passages only: TEI names no role")
def test_haystack_huggingface_embeds(ragrank: str, vectors: Callable[..., np.ndarray]):
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPITextEmbedder,
    )
    from huggingface_hub.errors import HfHubHTTPError

    embedder = HuggingFaceAPITextEmbedder(
        api_type="text_embeddings_inference", api_params={"url": ragrank}, token=_secret()
    )
    assert_vectors([embedder.run(text=TEXTS[0])["embedding"]], TEXTS[:1], "passage", vectors)
    with pytest.raises(HfHubHTTPError, match=TEXT_LIMIT):
        embedder.run(text=LONG_TEXT)


# -- the docs ----------------------------------------------------------------------------------

MATRIX_DOC = Path(__file__).parents[2] / "docs" / "clients.md"
BEGIN, END = "<!-- matrix: begin -->", "<!-- matrix: end -->"


def render(matrix: Sequence[Cell]) -> str:
    """The matrix as docs/clients.md holds it: one row per cell."""
    rows = [
        "| framework | provider | operation | works | notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in sorted(matrix, key=lambda c: (c.framework, c.operation, c.provider)):
        works = "yes" if c.works else "**no**"
        rows.append(f"| {c.framework} | {c.provider} | {c.operation} | {works} | {c.note} |")
    return "\n".join(rows)


def test_the_docs_hold_this_matrix():
    text = MATRIX_DOC.read_text(encoding="utf-8")
    found = re.search(f"{re.escape(BEGIN)}\n(.*?)\n{re.escape(END)}", text, re.S)
    assert found, f"docs/clients.md needs the matrix between {BEGIN} and {END}"
    assert found.group(1) == render(CELLS), "docs/clients.md's matrix is stale:\n" + render(CELLS)
