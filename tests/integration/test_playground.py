"""The playground in a real browser: Debian's headless Chromium, driven by Playwright, against a
real `ragrank serve` on the bundled sample with API keys and labels. The models are tiny and
random, so these tests check what the page shows against what the API answers, never whether
an order is good."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from eval.metrics import score_run
from eval.random_models import save_random_model
from eval.screenshot import CHROMIUM, CHROMIUM_FLAGS
from indexing import Indexer
from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir
from ragrank.store import open_store
from tests.conftest import tiny_settings
from tests.servers import ragrank_serve

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from playwright.sync_api import Browser, Page, Route

    from ragrank.backends.models import SentenceTransformerEmbedder

KEY = "playground-browser-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
#: What a document may try; the page's own hook (`window.__injected`) must stay unset.
HOSTILE = {
    "id": "hostile-1",
    "title": 'Espresso <img src=x onerror="window.__injected = 1">',
    "text": "Espresso crema pressure <script>window.__injected = 2</script> "
    '<img src=x onerror="window.__injected = 3"> <b onmouseover="window.__injected = 4">bold</b>',
    "metadata": {"lang": "en", "topic": "<svg onload=window.__injected=5>"},
}
SCREENSHOT = os.environ.get("RAGRANK_PLAYGROUND_SCREENSHOT")


def _browser_or_skip() -> None:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (Debian's chromium package; `make browser`)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (the dev extra)")
    if missing:
        reason = "needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def second_reranker(tmp_path_factory: pytest.TempPathFactory, tiny_reranker_path: Path) -> Path:
    """Another tiny random reranker, initialised wide, so that its order is its own."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(tiny_reranker_path))
    config.initializer_range = 1.0
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_reranker_path))
    folder = tmp_path_factory.mktemp("second") / "wide-reranker"
    return save_random_model("reranker", config, tokenizer, folder)


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_embedder_path: Path,
    tiny_reranker_path: Path,
    second_reranker: Path,
    embedder: SentenceTransformerEmbedder,
) -> Iterator[str]:
    """`ragrank serve` on the bundled sample (indexed by the indexer, in this process, which
    saves a second process's start), with two rerankers, API keys and the sample's labels, and
    one hostile document added through its API."""
    _browser_or_skip()
    settings = tiny_settings(
        tmp_path_factory.mktemp("playground"), tiny_embedder_path, tiny_reranker_path
    )
    store = open_store(settings)
    try:
        indexer = Indexer.from_settings(settings, embedder, store)
        indexer.index(load_beir(SAMPLE_DATASET).corpus.values(), progress=False)
    finally:
        store.close()
    flags = [
        *("--embed-model", settings.embed_model, "--rerank-model", settings.rerank_model),
        *("--qdrant-path", str(settings.qdrant_path), "--collection", settings.collection),
        *("--device", "cpu"),
    ]
    env = {"RAGRANK_JOBS_PATH": str(settings.jobs_path)}
    env |= {"RAGRANK_API_KEYS": KEY, "RAGRANK_LABELS": str(SAMPLE_DATASET)}
    env |= {"RAGRANK_RERANK_MODELS": f"bge={tiny_reranker_path},wide={second_reranker}"}
    # The tiny dense model's judgement is random: keep it from lifting other languages'
    # passages over the lexical matches these tests look for.
    env |= {"RAGRANK_FUSION_OTHER_LANGUAGES": "0"}
    with ragrank_serve(flags, env) as (base, _):
        # A generous timeout, as for the searches below: on a loaded 2-core machine the
        # in-process worker's first indexing can hold a reply past httpx's 5 s default.
        job = httpx.post(
            f"{base}/v1/documents", json={"documents": [HOSTILE]}, headers=AUTH, timeout=60
        )
        assert job.status_code == 202, job.text
        for _ in range(240):
            status = httpx.get(
                f"{base}/v1/jobs/{job.json()['job_id']}", headers=AUTH, timeout=60
            ).json()
            if status["state"] == "done":
                break
            time.sleep(0.25)
        assert status["state"] == "done", status
        yield base


@pytest.fixture(scope="module")
def browser(served: str) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, served: str) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    # A blocked inline script or style would show up here: there must be none to block.
    opened.add_init_script(
        "document.addEventListener('securitypolicyviolation', e => "
        "(window.__violations = window.__violations || []).push(e.violatedDirective));"
    )
    opened.goto(f"{served}/playground")
    opened.wait_for_selector("body[data-state=ready]")
    yield opened
    violations = opened.evaluate("window.__violations || []")
    context.close()
    assert not problems and not violations, (problems, violations)


def _search(page: Page, query: str, *, key: str = KEY, **fields: str) -> str:
    """Fill the form, press Enter in the query box, wait for the answer; the page's state."""
    page.fill("#api-key", key)
    for name, value in fields.items():
        page.fill(f"#{name}", value)
    page.fill("#query", query)
    page.press("#query", "Enter")
    page.wait_for_selector("body[data-state=done], body[data-state=error]")
    return str(page.evaluate("document.body.dataset.state"))


def _keys(page: Page, column: str) -> list[str]:
    keys: list[str] = page.eval_on_selector_all(
        f"#{column}-list .hit", "l => l.map(e => e.dataset.key)"
    )
    return keys


def _api(base: str, **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{base}/v1/search", json=body, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _hit_keys(answer: dict[str, Any]) -> list[str]:
    return [f"{hit['doc_id']}#{hit['chunk']}" for hit in answer["results"]]


def _ndcg10(qrels: dict[str, int], keys: list[str]) -> float:
    docs = list(dict.fromkeys(key.rsplit("#", 1)[0] for key in keys))
    run = {"q": {doc: float(len(docs) - i) for i, doc in enumerate(docs)}}
    return score_run({"q": qrels}, run, "page").per_query["ndcg@10"]["q"]


def test_both_columns_show_what_the_api_returns_with_labels_and_moves(page: Page, served: str):
    dataset = load_beir(SAMPLE_DATASET)
    query_id = "q02"
    query = dataset.queries[query_id]
    assert page.is_visible("#api-key-field"), "the server has keys: the page must ask for one"
    assert _search(page, query, top_k="8", candidates="40") == "done"
    first = _api(served, query=query, top_k=8, candidates=40, rerank=False)
    reranked = _api(served, query=query, top_k=8, candidates=40, rerank=True)
    assert _keys(page, "first") == _hit_keys(first)
    assert _keys(page, "reranked") == _hit_keys(reranked)
    # Each reranked hit says where the first stage had it; lines join those in both columns.
    moves = page.eval_on_selector_all("#reranked-list .move", "l => l.map(e => e.textContent)")
    assert [
        f"(was #{hit['retrieval_rank']})" in move
        for hit, move in zip(reranked["results"], moves, strict=True)
    ] == [True] * 8
    shared = set(_hit_keys(first)) & set(_hit_keys(reranked))
    assert page.locator("#moves line").count() == len(shared)
    # Labels: relevant documents marked, NDCG@10 of each column as the eval suite computes it.
    qrels = dict(dataset.qrels[query_id])
    for column, answer in (("first", first), ("reranked", reranked)):
        marked = page.eval_on_selector_all(
            f"#{column}-list .hit:has(.relevant)", "l => l.map(e => e.dataset.docId)"
        )
        assert marked == [h["doc_id"] for h in answer["results"] if qrels.get(h["doc_id"], 0) > 0]
        shown = float(page.get_attribute(f"#{column}-ndcg", "data-value") or "nan")
        assert shown == pytest.approx(_ndcg10(qrels, _hit_keys(answer)), abs=1e-9)
    assert page.is_visible("#first-list .relevant"), "the first stage finds a labelled document"
    # The words BM25 matched highlighted, whole; timings as a stacked bar of the stages that ran.
    highlighted = page.eval_on_selector_all("mark", "l => l.map(e => e.textContent.toLowerCase())")
    assert highlighted and set(highlighted) <= {"why", "are", "leaves", "green"}
    stages = page.eval_on_selector_all(".bar span", "l => l.map(e => e.className)")
    assert {"stage-embed", "stage-retrieve", "stage-rerank"} <= set(stages)
    # The key lives in the tab's session only.
    assert page.evaluate("sessionStorage.getItem('ragrank-api-key')") == KEY
    assert page.evaluate("localStorage.length") == 0


def test_the_picker_reranks_with_the_chosen_model(page: Page, served: str):
    assert page.is_visible("#model-field"), "two rerankers are served: the page offers both"
    options = page.eval_on_selector_all("#model option", "l => l.map(e => e.value)")
    assert options == ["bge", "wide"]
    query = "Why are leaves green?"
    page.select_option("#model", "wide")
    assert _search(page, query, top_k="8", candidates="40") == "done"
    wide = _api(served, query=query, top_k=8, candidates=40, model="wide")
    default = _api(served, query=query, top_k=8, candidates=40)
    assert _keys(page, "reranked") == _hit_keys(wide)
    assert _hit_keys(wide) != _hit_keys(default), "the two random rerankers order differently"
    assert page.text_content("#reranked-name") == "(wide-reranker)"


def test_marks_are_the_whole_words_whose_stems_bm25_matched(page: Page, served: str):
    """A German query: "Länder" and "Donau" are marked where the server says BM25 met their
    stems; "die" is a stopword, and "der" is never marked inside another word."""
    query = "Durch welche Länder fließt die Donau?"
    assert _search(page, query, top_k="5", candidates="20") == "done"
    answer = _api(served, query=query, top_k=5, candidates=20, rerank=False, highlight=True)
    assert answer["sparse_language"] == "de"
    for position, hit in enumerate(answer["results"], start=1):
        marks = page.eval_on_selector_all(
            f"#first-list .hit:nth-child({position}) mark", "l => l.map(e => e.textContent)"
        )
        assert {m.lower() for m in marks} == {w.lower() for w in hit["matched"]}, hit["doc_id"]
    donau = page.eval_on_selector_all(
        '#first-list .hit[data-doc-id="rivers-de-2"] mark', "l => l.map(e => e.textContent)"
    )
    assert {"Länder", "Donau"} <= set(donau)
    every_mark = page.eval_on_selector_all("mark", "l => l.map(e => e.textContent.toLowerCase())")
    assert "die" not in every_mark and "der" not in every_mark


def test_the_filter_narrows_both_columns_and_bad_values_show_the_apis_message(
    page: Page, served: str
):
    query = "Was ist Kaffee?"
    assert _search(page, query, filter="lang=de") == "done"
    narrowed = _api(served, query=query, filter={"lang": "de"}, rerank=False)
    assert _keys(page, "first") == _hit_keys(narrowed) and narrowed["results"]
    assert {h["metadata"]["lang"] for h in narrowed["results"]} == {"de"}
    metadata = page.eval_on_selector_all(".hit .meta", "l => l.map(e => e.textContent)")
    assert metadata and all("lang=de" in line for line in metadata)
    # Over the limit: the API's own message, beside the field it names.
    assert _search(page, query, filter="", candidates="100000") == "error"
    refused = httpx.post(
        f"{served}/v1/search", json={"query": query, "candidates": 100000}, headers=AUTH
    )
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert message in page.text_content("#candidates-error")
    assert page.get_attribute("#candidates", "aria-invalid") == "true"
    # A filter key Qdrant cannot take: the API names the filter.
    assert _search(page, query, candidates="50", filter="bad key=1") == "error"
    assert "filter" in page.text_content("#filter-error")
    # A filter the page cannot read is refused beside it, before anything is sent.
    assert _search(page, query, filter="lang") == "error"
    assert page.text_content("#filter-error") == (
        "filter: write key=value pairs separated by commas, or a JSON object"
    )


def _answering(status: int, headers: dict[str, str]) -> Callable[[Route], None]:
    """A stand-in server answering every request with `status` and an API error body."""

    def answer(route: Route) -> None:
        body = '{"error": {"code": "busy", "message": "queue full"}}'
        route.fulfill(
            status=status, headers={"Content-Type": "application/json", **headers}, body=body
        )

    return answer


def test_a_missing_key_and_a_busy_or_unready_server_read_as_sentences(page: Page, served: str):
    assert _search(page, "coffee", key="") == "error"
    assert "This server needs an API key" in page.text_content("#api-key-error")
    for status, extra, expected in (
        (429, {"Retry-After": "7"}, "The server is busy: queue full. Try again in 7 s."),
        (503, {}, "The server is not ready: queue full"),
    ):
        page.route("**/v1/search", _answering(status, extra))
        assert _search(page, "coffee") == "error"
        assert page.text_content("#form-error") == expected
        page.unroute("**/v1/search")
    assert _search(page, "coffee") == "done"


def test_a_reranker_fallback_is_said_with_the_apis_reason(page: Page, served: str):
    """The server's own answer to `rerank: "auto"` when its reranker could not answer: the
    first stage's order, `reranked: false` and `rerank_error`. (A stand-in for the real
    fallback, which needs a failing model; the server's side is tested in the API tests.)"""
    reason = "queue_full: the rerank queue holds 4096 items"

    def fall_back(route: Route) -> None:
        body = route.request.post_data_json
        if body.get("rerank") != "auto":
            route.continue_()
            return
        answer = route.fetch(post_data=json.dumps({**body, "rerank": False})).json()
        route.fulfill(json={**answer, "reranked": False, "rerank_error": reason})

    page.route("**/v1/search", fall_back)
    assert _search(page, "coffee") == "done"
    assert page.text_content("#rerank-notice") == (
        f"Not reranked: {reason}. The right column shows the first stage's order."
    )
    assert _keys(page, "reranked") == _keys(page, "first")
    assert page.text_content("#reranked-name") == "(not reranked)"


def test_documents_are_shown_as_text_and_never_run(page: Page, served: str):
    assert _search(page, "Espresso crema pressure", top_k="20") == "done"
    titles = page.eval_on_selector_all(".hit .title", "l => l.map(e => e.textContent)")
    assert HOSTILE["title"] in titles
    texts = page.eval_on_selector_all(".hit .text", "l => l.map(e => e.textContent)")
    assert any("<script>window.__injected = 2</script>" in text for text in texts)
    page.hover(".hit .text >> nth=0")
    assert page.evaluate("window.__injected") is None
    assert page.locator("#results img, #results script, #results b, #results svg svg").count() == 0


def test_keyboard_focus_is_visible_and_narrow_screens_stack_the_columns(page: Page):
    page.keyboard.press("Tab")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none")
    page.set_viewport_size({"width": 420, "height": 900})
    assert _search(page, "coffee") == "done"
    first = page.locator("#first-column").bounding_box()
    reranked = page.locator("#reranked-column").bounding_box()
    assert first and reranked and reranked["y"] >= first["y"] + first["height"]
    assert not page.is_visible("#moves")


def test_the_playground_screenshot_is_a_small_png(page: Page, tmp_path: Path):
    for _ in range(2):  # the second search's timings are the warm server's
        assert _search(page, "Why are leaves green?", filter="lang=en") == "done"
    # Local model folders are shown by name, not by their path on the server's disk.
    assert page.text_content("#server-info").endswith("reranker tiny-bge-reranker")
    shot = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "playground.png"
    page.screenshot(path=str(shot))
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and 10_000 < len(data) < 400_000


def test_the_screenshot_command_searches_with_the_picked_reranker_and_saves_a_png(
    served: str, tmp_path: Path
):
    """`python -m eval.screenshot`, as `make screenshot-rerankers` runs it against the demo."""
    shot = tmp_path / "shot.png"
    command = [sys.executable, "-m", "eval.screenshot", "--url", served, "--out", str(shot)]
    command += ["--query", "Why are leaves green?", "--model", "wide", "--key", KEY]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # A server that never gets ready is named with the time waited, not a traceback.
    command = [sys.executable, "-m", "eval.screenshot", "--url", "http://127.0.0.1:9"]
    command += ["--out", str(shot), "--query", "q", "--wait", "0"]
    failed = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert failed.returncode != 0 and "was not ready within 0 s" in failed.stderr
