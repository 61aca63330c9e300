"""An exclusive lock on a file, held for as long as its handle is open: how one process claims
something other processes on the machine must leave alone (an embedded store's folder, a
SQLite queue's worker). The kernel drops it when the process dies, `kill -9` included."""

from __future__ import annotations

import fcntl
import os
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def lock_file(path: Path) -> IO[str] | None:
    """The open, locked file, with this process's id written in it for whoever looks; None
    when another process holds it."""
    handle = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
