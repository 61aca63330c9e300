"""OpenAI-shaped /v1/embeddings over HTTP, with the fake embedder."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.fakes import FakeEmbedder


@pytest.fixture
def client(fake_client, fake_services):
    fake_client.embedder = fake_services.embedder
    return fake_client


async def test_openai_shape_with_usage_and_prefix_by_input_type(client):
    response = await client.post(
        "/v1/embeddings",
        json={
            "model": "fake-embedder",
            "input": ["rivers and seas", "coffee"],
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == "fake-embedder"
    assert [item["index"] for item in body["data"]] == [0, 1]
    assert all(item["object"] == "embedding" for item in body["data"])
    vectors = np.array([item["embedding"] for item in body["data"]])
    assert vectors.shape == (2, FakeEmbedder.dimension)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert client.embedder.seen[-2:] == ["passage: rivers and seas", "passage: coffee"]
    # FakeEmbedder counts words + 2 per text, prefix included: 6 + 4.
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 10}
    await client.post("/v1/embeddings", json={"input": "rivers", "input_type": "query"})
    assert client.embedder.seen[-1] == "query: rivers"


async def test_base64_is_little_endian_float32_of_the_same_vector(client):
    plain = (await client.post("/v1/embeddings", json={"input": "rivers"})).json()
    packed = (
        await client.post("/v1/embeddings", json={"input": "rivers", "encoding_format": "base64"})
    ).json()
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, plain["data"][0]["embedding"], atol=1e-7)


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({"input": ""}, "input", "length >= 1"),
        ({"input": []}, "input", "length >= 1"),
        ({"input": ["x"] * 2049}, "input", "at most 2,048 items"),
        ({"input": "x" * 100_001}, "input", "at most 100,000 characters"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", "Invalid enum value"),
        ({"input": "x", "input_type": "document"}, "input_type", "Invalid enum value"),
        ({"input": [1, 2, 3]}, "input", "Expected"),
    ],
)
async def test_bad_requests_name_the_field(client, body, field, fragment):
    response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"].startswith(field)
    assert fragment in error["message"]


async def test_infinity_and_jina_call_the_same_route(client):
    infinity = await client.post(
        "/embeddings", json={"input": ["rivers"], "model": "fake-embedder"}
    )
    assert infinity.status_code == 200 and len(infinity.json()["data"]) == 1
    assert client.embedder.seen[-1] == "passage: rivers"
    for task, prefix in [("retrieval.query", "query: "), ("retrieval.passage", "passage: ")]:
        body = {"model": "fake-embedder", "input": ["seas"], "task": task}
        assert (await client.post("/v1/embeddings", json=body)).status_code == 200
        assert client.embedder.seen[-1] == prefix + "seas"
    packed = await client.post("/v1/embeddings", json={"input": "seas", "embedding_type": "base64"})
    assert isinstance(packed.json()["data"][0]["embedding"], str)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": "x", "dimensions": FakeEmbedder.dimension + 1}, "dimensions"),
        ({"input": "x", "late_chunking": True}, "late_chunking"),
        ({"input": "x", "normalized": False}, "normalized"),
        ({"input": "x", "task": "retrieval.document"}, "task"),
        ({"input": "x", "inputs": "x"}, "inputs"),
    ],
)
async def test_what_ragrank_cannot_honour_is_refused(client, body, field):
    response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
    fine = await client.post(
        "/v1/embeddings", json={"input": "x", "dimensions": FakeEmbedder.dimension}
    )
    assert fine.status_code == 200  # the model's own length


@pytest.mark.parametrize("path", ["/embed", "/"])
async def test_tei_shape_answers_a_list_of_vectors(client, path):
    response = await client.post(path, json={"inputs": "rivers", "normalize": False})
    assert response.status_code == 200, response.text
    vectors = np.array(response.json())
    assert vectors.shape == (1, FakeEmbedder.dimension)
    assert client.embedder.seen[-1] == "passage: rivers"
    await client.post(path, json={"inputs": ["a", "b"], "prompt_name": "query"})
    assert client.embedder.seen[-2:] == ["query: a", "query: b"]
    bad = await client.post(path, json={"inputs": "x", "prompt_name": "title"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "prompt_name"


async def test_cohere_shape_v1_floats_or_by_type_and_v2_by_type(client):
    body = {"texts": ["rivers"], "model": "fake-embedder", "input_type": "search_query"}
    v1 = (await client.post("/v1/embed", json=body)).json()
    assert v1["response_type"] == "embeddings_floats" and v1["texts"] == ["rivers"]
    assert len(v1["embeddings"][0]) == FakeEmbedder.dimension
    assert client.embedder.seen[-1] == "query: rivers"
    assert v1["meta"]["api_version"]["version"] == "1"
    typed = (await client.post("/v1/embed", json={**body, "embedding_types": ["float"]})).json()
    assert typed["response_type"] == "embeddings_by_type"
    assert typed["embeddings"]["float"] == v1["embeddings"]
    v2 = (await client.post("/v2/embed", json={**body, "input_type": "search_document"})).json()
    assert (
        v2["response_type"] == "embeddings_by_type" and v2["meta"]["api_version"]["version"] == "2"
    )
    assert client.embedder.seen[-1] == "passage: rivers"
    refused = await client.post("/v2/embed", json={**body, "embedding_types": ["int8"]})
    assert refused.status_code == 400 and refused.json()["error"]["field"].startswith(
        "embedding_types"
    )
    images = await client.post("/v2/embed", json={**body, "images": ["data:..."]})
    assert images.status_code == 400 and images.json()["error"]["field"] == "images"


async def test_the_schema_names_the_served_vector_length(client):
    schemas = (await client.get("/schema/openapi.json")).json()["components"]["schemas"]
    for name, field in [
        ("EmbeddingsRequest", "dimensions"),
        ("CohereEmbedRequest", "output_dimension"),
    ]:
        (integer,) = [
            s for s in schemas[name]["properties"][field]["anyOf"] if s.get("type") == "integer"
        ]
        assert integer["minimum"] == integer["maximum"] == FakeEmbedder.dimension
    assert schemas["EmbeddingsRequest"]["properties"]["late_chunking"]["enum"] == [False]
