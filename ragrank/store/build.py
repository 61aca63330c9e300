"""Build a Qdrant Edge shard's HNSW graph in a process of its own:
`python -m ragrank.store.build SHARD_FOLDER PARENT_PID`. The serving process runs it so that
the build, which holds its interpreter lock throughout, never stops the searches (see
`EdgeStore.optimize`). It dies with its parent, so that a restarted server finds the shard
free."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import qdrant_edge as edge

#: prctl(2): deliver a signal to this process when its parent dies.
PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    path, parent = argv[0], int(argv[1])
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above took effect
        return 1
    shard = edge.EdgeShard.load(path)
    try:
        shard.optimize()
        shard.flush()
    finally:
        shard.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
