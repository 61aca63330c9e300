"""Official client libraries, pointed at a live server on loopback, work unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

from ragrank.settings import Settings
from server import Services, create_app
from tests.fakes import FakeEmbedder
from tests.servers import app_on_socket

if TYPE_CHECKING:
    from collections.abc import Iterator

DOCUMENTS = ["short one", "a much longer document about rivers and seas", "medium text here"]


@pytest.fixture
def live_server(fake_services: Services) -> Iterator[str]:
    with app_on_socket(create_app(Settings(), services=fake_services)) as base:
        yield base


def test_the_cohere_v2_client_reranks_unchanged(live_server):
    cohere = pytest.importorskip("cohere")
    client = cohere.ClientV2(api_key="not-checked", base_url=live_server)
    response = client.rerank(model="fake-scorer", query="rivers", documents=DOCUMENTS, top_n=2)
    assert [result.index for result in response.results] == [1, 2]
    assert response.results[0].relevance_score > response.results[1].relevance_score


def test_the_openai_client_embeds_unchanged(live_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(api_key="not-checked", base_url=f"{live_server}/v1")
    response = client.embeddings.create(model="fake-embedder", input=["rivers and seas", "coffee"])
    assert [item.index for item in response.data] == [0, 1]
    assert len(response.data[0].embedding) == FakeEmbedder.dimension
    assert response.usage.prompt_tokens > 0
    # The client asks for base64 by default; floats must decode to the same vector.
    floats = client.embeddings.create(
        model="fake-embedder", input="rivers and seas", encoding_format="float"
    )
    assert floats.data[0].embedding == pytest.approx(response.data[0].embedding, abs=1e-6)


def test_the_cohere_clients_rerank_v1_and_embed_v1_and_v2(live_server):
    cohere = pytest.importorskip("cohere")
    v1 = cohere.Client(api_key="not-checked", base_url=live_server)
    ranked = v1.rerank(
        model="fake-scorer",
        query="rivers",
        documents=DOCUMENTS,
        top_n=1,
        return_documents=True,
    )
    assert [r.index for r in ranked.results] == [1]
    assert ranked.results[0].document.text == DOCUMENTS[1]
    floats = v1.embed(texts=["rivers"], model="fake-embedder", input_type="search_query")
    assert len(floats.embeddings[0]) == FakeEmbedder.dimension
    v2 = cohere.ClientV2(api_key="not-checked", base_url=live_server)
    typed = v2.embed(
        texts=["rivers"],
        model="fake-embedder",
        input_type="search_query",
        embedding_types=["float"],
    )
    np.testing.assert_allclose(typed.embeddings.float_, floats.embeddings, atol=1e-6)
