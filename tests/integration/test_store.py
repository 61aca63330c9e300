"""An index build in a child process alongside searches of the embedded store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragrank.store import EdgeStore
from tests.data import make_chunks, unit

if TYPE_CHECKING:
    from pathlib import Path

if TYPE_CHECKING:
    import pytest


def test_a_build_alongside_searches_keeps_them_answering_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The serving process's build: a child process builds the graph while this one searches
    a copy of the shard; searches answer throughout, exactly; a write waits for the build and
    then lands."""
    import threading
    import time

    from ragrank.store import IndexTuning, edge

    tuning = IndexTuning(indexing_threshold_kb=1, full_scan_threshold_kb=1, ef=256)
    store = EdgeStore(tmp_path / "q", "c", tuning=tuning)
    store.ensure_collection(16)
    vectors = unit(3000, 16)
    for start in range(0, 3000, 500):
        store.upsert(make_chunks(500, f"d{start}"), vectors[start : start + 500])
    queries = unit(10, 16, seed=9)

    def ids(exact: bool) -> list[list[str]]:
        hits = (store.search(q, 10, exact=exact) for q in queries)
        return [[f"{h.chunk.doc_id}/{h.chunk.chunk_index}" for h in found] for found in hits]

    exact = ids(True)
    building = threading.Event()
    build = edge.build_in_child

    def observed_build(path: Path) -> None:
        building.set()
        try:
            build(path)
        finally:
            building.clear()

    monkeypatch.setattr(edge, "build_in_child", observed_build)
    builder = threading.Thread(target=lambda: store.optimize(while_serving=True))
    builder.start()
    assert building.wait(30)
    landed: list[float] = []
    writer = threading.Thread(
        target=lambda: (
            store.upsert(make_chunks(5, "late"), unit(5, 16)),
            landed.append(time.time()),
        )
    )
    writer.start()
    during = 0
    while building.is_set():
        answer = ids(False)
        if building.is_set():  # began and ended within the build
            assert answer == exact
            during += 1
    ended = time.time()
    builder.join()
    writer.join()
    try:
        assert during > 0
        assert landed and landed[0] >= ended - 0.5  # the write waited for the build
        assert store.unindexed() == 5 and store.count() == 3005  # only the late write waits
        assert not (tmp_path / "q" / "edge" / ".c.reading").exists()
    finally:
        store.close()
