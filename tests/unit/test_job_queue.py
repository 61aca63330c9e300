"""The durable job queue's order and its counts."""

from __future__ import annotations

import time

from indexing import JobStore
from ragrank.documents import Document


def test_jobs_run_in_the_order_they_were_written_whatever_their_clocks(tmp_path, monkeypatch):
    """Two API threads may stamp their jobs in one order and commit them in the other: the
    worker follows the commits, as a replay of the queue does."""
    jobs = JobStore(tmp_path / "jobs.sqlite3")
    clock = iter([200.0, 200.0, 100.0, 100.0, 300.0, 300.0])
    monkeypatch.setattr(time, "time", lambda: next(clock))
    first = jobs.add_upsert([Document(doc_id="a", text="x")])
    second = jobs.add_delete("a")  # stamped earlier, written later
    monkeypatch.undo()
    assert [job.id for job in jobs.jobs()] == [first, second]
    claimed = jobs.claim()
    assert claimed is not None and claimed.id == first
    assert jobs.states() == {"queued": 1, "running": 1, "done": 0, "failed": 0}
