"""Where a batch's time goes, and how long the device sat idle while work waited.

Host stages (tokenise, collate, answer) run on the host pool or the event loop; device stages
(host-to-device, forward, device-to-host) on the model's thread. An operator reads the totals
from Prometheus; `make bench-served` reads them as shares of wall time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

#: The stages of one request's items, in order. `queue_wait` is each item's wait from arrival
#: until its batch's forward pass starts, summed over the items: latency, not work.
STAGES = ("queue_wait", "tokenise", "collate", "h2d", "forward", "d2h", "answer")

#: The idle share's gauge looks back this far.
IDLE_WINDOW_S = 60.0


@dataclass
class DeviceClock:
    """The model thread's busy spans and the gaps in which work waited for it.

    A gap counts as idle from the later of the last forward pass's end and the arrival of the
    oldest item of the next batch, until that batch starts: the device had work and did not
    run it (host work, a convoy, the event loop). Safe to call from any thread."""

    busy_s: float = 0.0
    idle_s: float = 0.0
    _last_end: float | None = None
    _recent: deque[tuple[float, float, float]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ran(self, waiting_since: float, started: float, ended: float) -> None:
        """A forward pass ran from `started` to `ended` (`time.perf_counter`); its batch's
        oldest item arrived at `waiting_since`. Passes may overlap (the next one launched while
        this one's output is copied back): only the time not yet counted is busy."""
        with self._lock:
            last = self._last_end
            gap_from = waiting_since if last is None else max(last, waiting_since)
            idle = max(0.0, started - gap_from)
            busy = max(0.0, ended - (started if last is None else max(started, last)))
            self.busy_s += busy
            self.idle_s += idle
            self._last_end = ended if last is None else max(last, ended)
            self._recent.append((ended, idle, busy))
            while self._recent and self._recent[0][0] < ended - IDLE_WINDOW_S:
                self._recent.popleft()

    def idle_share(self) -> float:
        """Of the recent time the device had work, the share it sat idle (0 when it had none)."""
        with self._lock:
            horizon = time.perf_counter() - IDLE_WINDOW_S
            idle = sum(i for end, i, _ in self._recent if end >= horizon)
            busy = sum(b for end, _, b in self._recent if end >= horizon)
        return idle / (idle + busy) if idle + busy else 0.0


@dataclass
class StageTotals:
    """Seconds spent in each stage since the engine started (`queue_wait`: item-seconds)."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] += seconds

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.seconds)
