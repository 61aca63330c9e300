"""`ragrank demo`: index the bundled sample and show first-stage vs reranked order, on the
services the stack then serves with (the command line runs both, `cli.stack`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.table import Table

from indexing import Indexer
from ragrank import SAMPLE_DATASET
from ragrank.beir import BeirDataset, load_beir
from ragrank.device import resolve_placement
from server import SearchPipeline, Services

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rich.console import Console

    from ragrank.settings import Settings
    from server.pipeline import SearchOutcome

#: Queries shown by the demo: English, French and Japanese, with labelled answers.
EXAMPLE_QUERIES = ("q04", "q08", "q13")


def demo_settings(settings: Settings) -> Settings:
    """The playground marks the sample's labelled answers and scores each of its queries."""
    return settings if settings.labels is not None else settings.replace(labels=SAMPLE_DATASET)


def announce(settings: Settings, console: Console) -> float:
    """Say what the demo runs on, before the models load; returns the time it started."""
    placement = resolve_placement(settings.device, settings.dtype)
    store_place = settings.qdrant_url or f"embedded Qdrant in {settings.qdrant_path}"
    dtype = str(placement.dtype).removeprefix("torch.")
    console.print(
        f"[bold]ragrank demo[/] on {placement.device} ({dtype})\n"
        f"  embedder: {settings.embed_model}\n  reranker: {settings.rerank_model}\n"
        f"  store:    {store_place}, collection '{settings.collection}'\n"
        "Loading models (the first run downloads them from the Hugging Face Hub)..."
    )
    return time.perf_counter()


def show_demo(services: Services, settings: Settings, console: Console, *, started: float) -> None:
    """Index the bundled sample, print a few queries in both orders, and say where to go next.
    Runs on the services the server then serves with, before it starts."""
    console.print(f"Models loaded in {time.perf_counter() - started:.1f} s.")
    dataset = load_beir(SAMPLE_DATASET)
    inference = services.inference
    with inference.running():
        indexer = Indexer.from_settings(settings, inference.bulk_embedder(), services.store)
        console.print(str(indexer.index(dataset.corpus.values())))
        inference.call(_show_examples(services, settings, dataset, console))
    base = f"http://{settings.host}:{settings.port}"
    console.print(
        "\nTry your own query:\n"
        f"  curl -s {base}/v1/search -H 'Content-Type: application/json' "
        '-d \'{"query": "How do heat pumps work?", "top_k": 5}\'\n'
        f"OpenAPI: {base}/schema   Readiness: {base}/ready"
    )
    if settings.playground == "on":
        console.print(
            f"[bold]Playground:[/] {base}/playground  (first stage and reranked side by side)"
        )


async def _show_examples(
    services: Services, settings: Settings, dataset: BeirDataset, console: Console
) -> None:
    search = SearchPipeline(services, settings)
    try:
        for query_id in EXAMPLE_QUERIES:
            query = dataset.queries[query_id]
            relevant = dataset.qrels.get(query_id, {})
            first = await search.search(query, top_k=5, candidates=20, rerank=False)
            reranked = await search.search(query, top_k=5, candidates=20, rerank=True)
            console.print(_comparison(query, first, reranked, relevant))
    finally:
        search.close()


def _comparison(
    query: str, first: SearchOutcome, reranked: SearchOutcome, labels: Mapping[str, int]
) -> Table:
    timings = reranked.timings_ms
    table = Table(
        title=f"{query}  (✓ = labelled relevant; reranking 20 candidates took "
        f"{timings['rerank']:.0f} ms, the whole query {timings['total']:.0f} ms)",
        title_justify="left",
    )
    table.add_column("#", justify="right")
    table.add_column(f"{first.retrieval} order")
    table.add_column(first.retrieval, justify="right")
    table.add_column("reranked order")
    table.add_column("rerank", justify="right")
    for rank in range(max(len(first.hits), len(reranked.hits))):
        row = [str(rank + 1)]
        for outcome in (first, reranked):
            if rank < len(outcome.hits):
                hit = outcome.hits[rank]
                mark = "✓ " if labels.get(hit.candidate.chunk.doc_id, 0) > 0 else "  "
                row += [f"{mark}{hit.candidate.chunk.title}", f"{hit.score:.3f}"]
            else:
                row += ["", ""]
        table.add_row(*row)
    return table
