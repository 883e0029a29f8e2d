"""How much of the CPU other programs took while Compare measured: the machine's busy CPU time (psutil, all
cores) less this process's own, read at each run's start and end. A speed ratio measured while something else
ran is partly that program's doing, so the window says when this share was high."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

# Other programs used more than this share of all cores' time during the runs: the machine is called busy.
# One other busy process on a 2-core machine takes up to half (DESIGN.md: it cut llama.cpp from ~72 to ~24 tok/s);
# a desktop's background work stays well under a quarter.
BUSY_SHARE = 0.25
_IDLE_FIELDS = ("idle", "iowait")
_GUEST_FIELDS = ("guest", "guest_nice")  # already counted in user time on Linux


@dataclass(frozen=True)
class CpuReading:
    wall_s: float
    busy_s: float  # CPU seconds the whole machine spent busy, all cores summed
    own_s: float  # CPU seconds this process spent (its threads; not its children)


def read() -> CpuReading:
    times = psutil.cpu_times()
    fields = times._asdict()
    total = sum(v for k, v in fields.items() if k not in _GUEST_FIELDS)
    busy = total - sum(fields.get(k, 0.0) for k in _IDLE_FIELDS)
    own = psutil.Process().cpu_times()
    return CpuReading(time.monotonic(), busy, own.user + own.system)


class OthersMeter:
    """Other programs' CPU time over a set of intervals (the runs), as a share of all cores' time."""

    def __init__(self):
        self.others_s = 0.0
        self.capacity_s = 0.0
        self._start: CpuReading | None = None

    def start(self) -> None:
        self._start = read()

    def stop(self) -> float | None:
        """End an interval: its share (None when too short to read: psutil counts in clock ticks)."""
        if self._start is None:
            return None
        start, end, self._start = self._start, read(), None
        capacity = (end.wall_s - start.wall_s) * (psutil.cpu_count() or 1)
        if capacity < 0.05:
            return None
        others = min(max((end.busy_s - start.busy_s) - (end.own_s - start.own_s), 0.0), capacity)
        self.others_s += others
        self.capacity_s += capacity
        return others / capacity

    @property
    def share(self) -> float | None:
        return self.others_s / self.capacity_s if self.capacity_s else None
