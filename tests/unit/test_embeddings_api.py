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
            "model": "text-embedding-3-small",
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
