"""The playground's picture, taken in Debian's headless Chromium against a running server:
`make screenshot-rerankers` serves the demo with the rerankers trained here and takes it, so
the picture the README shows is a real reranking rather than a random model's order.

    python -m eval.screenshot --url http://127.0.0.1:8765 --out docs/playground.png \
        --query "Why are leaves green?" --model teacher
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from eval.bench.harness import wait_until_ready
from ragrank.errors import RagrankError

CHROMIUM = Path(os.environ.get("RAGRANK_CHROMIUM", "/usr/bin/chromium"))
#: As a sandboxed CI job runs it: no sandbox (root), no GPU, and none of Chromium's own
#: connections to Google's services, which a closed network refuses.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def take(url: str, out: Path, query: str, model: str | None, key: str | None) -> None:
    """Search twice (the second shows the warm server's timings) and save the page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(f"{url}/playground")
        page.wait_for_selector("body[data-state=ready]")
        if key:
            page.fill("#api-key", key)
        if model and page.is_visible("#model"):  # hidden when one reranker is served
            page.select_option("#model", model)
        for _ in range(2):
            page.fill("#query", query)
            page.press("#query", "Enter")
            page.wait_for_selector("body[data-state=done], body[data-state=error]", timeout=120_000)
        state = page.evaluate("document.body.dataset.state")
        if state != "done":
            raise SystemExit(f"the search failed in the page: {page.text_content('#form-error')}")
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.screenshot", description=__doc__)
    parser.add_argument("--url", required=True, help="the running server's address")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--query", required=True)
    parser.add_argument("--model", help="the served reranker to pick in the page")
    parser.add_argument("--key", default=os.environ.get("RAGRANK_API_KEY"), help="an API key")
    parser.add_argument("--wait", type=float, default=600, help="seconds to wait for /ready")
    args = parser.parse_args(argv)
    try:
        wait_until_ready(f"{args.url}/ready", args.wait)
    except RagrankError as error:
        raise SystemExit(str(error)) from None
    take(args.url, args.out, args.query, args.model, args.key)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
