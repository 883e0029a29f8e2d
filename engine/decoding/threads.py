"""Fewer llama.cpp threads when another process takes the cores, measured rather than assumed.

Measured on this 2-core machine with one other busy process (Gemma 3 270M, open prompts, 100 tokens):
2 threads 38.8 tok/s plain, 1 thread 93.0 (lookup 35.9 vs 96.1). llama.cpp's threads wait for each other
at every graph node, so one preempted thread stalls them all. So when steps turn slow (StepCosts says
contended) the loop tries half the threads, keeps whichever count's recent steps are faster, and now and
then tries the full count again, since the other process may have gone.
"""
from __future__ import annotations

import statistics
from collections import deque

TRIAL_STEPS = 8  # steps at a thread count before judging it
RETRY_EVERY = 128  # steps on fewer threads between tries of the full count


class ThreadTuner:
    def __init__(self, full: int):
        self.full = full
        self.current = full
        self._recent: dict[int, deque[float]] = {}
        self._steps_here = 0
        self._trying: int | None = None  # the count on trial, judged against the one before it
        self._before: int | None = None

    def record(self, per_row_seconds: float, contended: bool) -> int | None:
        """One step's cost in one-row steps' seconds; returns a thread count to switch to, or None."""
        self._recent.setdefault(self.current, deque(maxlen=TRIAL_STEPS)).append(per_row_seconds)
        self._steps_here += 1
        if self._trying is not None:
            if self._steps_here < TRIAL_STEPS:
                return None
            tried, before = self._median(self._trying), self._median(self._before)
            keep = self._trying if before is None or tried < before else self._before
            self._trying = None
            return self._switch(keep)
        if self.full < 2:
            return None
        if self.current == self.full and contended and self._steps_here >= TRIAL_STEPS:
            return self._try(max(1, self.full // 2))
        if self.current < self.full and self._steps_here >= RETRY_EVERY:
            return self._try(self.full)
        return None

    def _median(self, threads: int | None) -> float | None:
        recent = self._recent.get(threads)
        return statistics.median(recent) if recent else None

    def _try(self, threads: int) -> int:
        self._trying, self._before = threads, self.current
        self._recent.pop(threads, None)  # judge it on fresh steps only
        return self._switch(threads)

    def _switch(self, threads: int) -> int | None:
        changed = threads != self.current
        self.current, self._steps_here = threads, 0
        return threads if changed else None
