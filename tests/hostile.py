"""Hostile requests built to break parsers and validators, as recipes: deep nesting, long
arrays and strings, huge and non-finite numbers, invalid UTF-8, surrogates, NUL bytes,
duplicate keys, wrong media types, cut and streamed bodies, odd ids in paths.

A recipe is a small JSON object, so the corpus of them lives in the repository
(`tests/corpus/hostile.jsonl`) and a regression is replayed exactly; `build` turns one into
the request's bytes. `python -m tests.hostile` rewrites the corpus from its seed, keeping the
recipes marked `regression`."""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).parent / "corpus" / "hostile.jsonl"
SEED = 20261202
GENERATED = 400

#: A valid body per route that reads one, and the fields a breach can be put in.
ROUTES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "/v1/search": (
        {"query": "tea", "top_k": 3, "candidates": 5},
        ("query", "filter", "top_k", "rerank", "retrieval", "rrf_k", "dense_weight", "zz"),
    ),
    "/v1/rerank": (
        {"query": "tea", "documents": ["green tea", "coffee"]},
        ("query", "documents", "model", "top_n", "return_documents", "zz"),
    ),
    "/v2/rerank": ({"query": "tea", "documents": ["green tea"]}, ("documents", "top_n", "zz")),
    "/rerank": ({"query": "tea", "texts": ["green tea", "coffee"]}, ("query", "texts", "zz")),
    "/v1/embeddings": ({"input": ["tea"]}, ("input", "model", "input_type", "user", "zz")),
    "/v1/documents": (
        {"documents": [{"id": "hostile", "text": "x", "metadata": {"k": 1}}]},
        ("documents", "zz"),
    ),
}

NUMBERS = (
    "1e999",
    "-1e999",
    "1e-999",
    "NaN",
    "Infinity",
    "-Infinity",
    "-0",
    "0.0000000000000000000000001",
    "9" * 400,
    "9" * 5_000,
    "-" + "9" * 30,
    "1.5",
    "1e2",
    "01",
    "0x10",
    "+1",
    ".5",
)
#: Raw byte strings put inside a JSON string literal: invalid UTF-8, lone and paired surrogate
#: escapes, NUL and other control characters, raw and escaped.
STRING_BYTES = (
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\\ud800",
    b"\\udc00x",
    b"\\ud83d\\ude00",
    b"\\u0000",
    b"\x00",
    b"\x01\x1f",
    b"\\",
    b"\\x41",
    b"\xef\xbb\xbf",
    b"\\u202e",
)
MEDIA_TYPES = (
    "",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/xml",
    "application/json; charset=latin-1",
    "application/problem+json",
    "APPLICATION/JSON",
    "application/json, text/plain",
    "application/jsonx",
    ";;;",
)
#: Ids for a path, with how often each repeats.
PATH_IDS = (
    ("x", 10_000),
    ("x", 513),
    ("x", 512),
    ("%00", 1),
    ("a%0Ab", 1),
    ("%FF%FE", 1),
    ("%ED%A0%80", 1),
    ("..%2F..%2Fetc", 1),
    ("a/b/../c", 1),
    ("%", 1),
    ("%zz", 1),
    ("%E2%80%AE", 1),
    ("&#x0;", 1),
)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes | None
    media_type: str
    #: Sent in pieces without a length (chunked), when set.
    chunks: int = 0


def build(recipe: dict[str, Any]) -> Request:
    """The request a recipe stands for."""
    kind = recipe["kind"]
    route = recipe.get("route", "/v1/search")
    repeat = recipe.get("repeat", 1)  # a long id or body, kept short in the corpus
    if kind == "path":
        prefix = "/v1/jobs/" if recipe["target"] == "job" else "/v1/documents/"
        method = "GET" if recipe["target"] == "job" else "DELETE"
        return Request(method, prefix + recipe["id"] * repeat, None, "")
    base, _ = ROUTES[route]
    media = recipe.get("media_type", "application/json")
    raw = json.dumps(base).encode()
    if kind == "value":
        raw = _with(base, recipe["field"], _value(recipe))
    elif kind == "duplicate":
        raw = raw[:-1] + b", " + (f'"{recipe["field"]}": 1, ' * 2).encode()[:-2] + b"}"
    elif kind == "cut":
        raw = raw[: recipe["at"]]
    elif kind == "bytes":
        raw = bytes.fromhex(recipe["hex"]) * repeat
    return Request("POST", route, raw, media, recipe.get("chunks", 0))


def _value(recipe: dict[str, Any]) -> bytes:
    shape, size = recipe["shape"], recipe.get("size", 1)
    if shape == "nest":
        opening, closing = (b"[", b"]") if recipe.get("array") else (b'{"a":', b"}")
        return opening * size + b"1" + closing * size
    if shape == "array":
        item = recipe.get("item", "1").encode()
        return b"[" + b",".join([item] * size) + b"]"
    if shape == "object":
        return b"{" + b",".join(f'"k{i}":{i}'.encode() for i in range(size)) + b"}"
    if shape == "string":
        return b'"' + recipe.get("char", "x").encode() * size + b'"'
    if shape == "number":
        return str(recipe["number"]).encode()
    if shape == "raw_string":
        return b'"a' + bytes.fromhex(recipe["hex"]) + b'b"'
    raise ValueError(f"unknown shape {shape!r}")


def _with(base: dict[str, Any], field: str, value: bytes) -> bytes:
    """`base` with `field` set to the raw JSON `value`, spliced in as bytes: it may not be
    valid JSON, which is the point."""
    rest = {k: v for k, v in base.items() if k != field}
    head = json.dumps(rest).encode()[:-1]
    separator = b", " if rest else b""
    return head + separator + json.dumps(field).encode() + b": " + value + b"}"


def generate(seed: int, count: int) -> list[dict[str, Any]]:
    """`count` recipes from `seed`, spread over every route and every kind of breach."""
    rng = random.Random(seed)
    recipes: list[dict[str, Any]] = []
    for _ in range(count):
        route = rng.choice(list(ROUTES))
        fields = ROUTES[route][1]
        kind = rng.choice(("value",) * 6 + ("duplicate", "cut", "bytes", "media", "path"))
        recipe: dict[str, Any] = {"kind": kind, "route": route}
        if kind == "value":
            recipe.update(_random_value(rng), field=rng.choice(fields))
        elif kind == "duplicate":
            recipe["field"] = rng.choice(fields)
        elif kind == "cut":
            recipe["at"] = rng.randrange(0, len(json.dumps(ROUTES[route][0])))
        elif kind == "bytes":
            recipe["hex"] = rng.randbytes(rng.randrange(1, 64)).hex()
        elif kind == "media":
            recipe = {"kind": "value", "route": route, "field": rng.choice(fields)}
            recipe.update(shape="string", size=3, media_type=rng.choice(MEDIA_TYPES))
        else:
            recipe = {"kind": "path", "target": rng.choice(("job", "document"))}
            recipe["id"], recipe["repeat"] = rng.choice(PATH_IDS)
        if kind != "path" and rng.random() < 0.1:
            recipe["chunks"] = rng.randrange(2, 8)
        recipes.append(recipe)
    return recipes


def _random_value(rng: random.Random) -> dict[str, Any]:
    shape = rng.choice(("nest", "array", "object", "string", "number", "raw_string"))
    if shape == "nest":
        return {
            "shape": shape,
            "size": rng.choice((5, 31, 33, 200, 1_000, 5_000, 100_000)),
            "array": rng.random() < 0.5,
        }
    if shape == "array":
        item = rng.choice(("1", "[]", "{}", '""', "null", "1e308", '"x"'))
        return {"shape": shape, "size": rng.choice((0, 1, 20_480, 20_481, 400_000)), "item": item}
    if shape == "object":
        return {"shape": shape, "size": rng.choice((0, 17, 256, 257, 5_000))}
    if shape == "string":
        char = rng.choice(("x", "é", "\u4e2d", "\U0001f600", " "))
        return {
            "shape": shape,
            "size": rng.choice((0, 1, 2_001, 1_000_001, 3_000_000, 17_000_000)),
            "char": char,
        }
    if shape == "number":
        return {"shape": shape, "number": rng.choice(NUMBERS)}
    return {"shape": shape, "hex": rng.choice(STRING_BYTES).hex()}


def load() -> list[dict[str, Any]]:
    """The corpus: every recipe the repository keeps."""
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def main() -> None:
    kept = [r for r in load() if r.get("regression")] if CORPUS.exists() else []
    recipes = kept + generate(SEED, GENERATED)
    CORPUS.parent.mkdir(exist_ok=True)
    CORPUS.write_text("".join(json.dumps(r) + "\n" for r in recipes), encoding="utf-8")
    print(f"wrote {len(recipes)} recipes ({len(kept)} regressions) to {CORPUS}", file=sys.stderr)


if __name__ == "__main__":
    main()
