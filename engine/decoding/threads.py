"""Fewer llama.cpp threads when another process takes the cores, measured rather than assumed.

Measured on this 2-core machine with one other busy process (Gemma 3 270M, open prompts, 100 tokens):
2 threads 38.8 tok/s plain, 1 thread 93.0 (lookup 35.9 vs 96.1). llama.cpp's threads wait for each other
at every graph node, so one preempted thread stalls them all. So when steps turn slow (StepCosts says
contended, and once early and then rarely without that) the loop tries half the threads, keeps whichever
count's recent steps are clearly faster, and now and then tries the full count again, since the other
process may have gone.
"""

from __future__ import annotations

import statistics
from collections import deque

TRIAL_STEPS = 8  # steps at a thread count before judging it
# Steps on fewer threads between tries of the full count. Short, because a false alarm is dear: this VM's
# steps slow down now and then with nothing else running, a trial of 1 thread can then look faster than
# the slow steps before it, and 1 thread verifies several rows ~2x slower (measured: lookup fell from 277
# to 179 tok/s for the 128 steps it stayed).
RETRY_EVERY = 32
# Fewer threads on trial are kept only when this much faster than the count before. A busy core makes one thread
# 2.4x faster (above), while this VM's own speed swings by up to 1.5x over seconds: at 0.9, trials that fell on
# the end of a slow spell were kept, and SmolLM2's quiet plain decoding spent 3% of its steps on one thread,
# 1.3x slower each (1-2% of its speed; 2 of 5 trials in 2,388 steps kept, each for RETRY_EVERY steps).
TRIAL_MARGIN = 0.75
# Fewer threads are also tried now and then without a sign of contention: a machine that was busy from the
# first step on never looks slower than itself (measured: plain decoding with a busy core from the start
# stayed at 38.8 tok/s on 2 threads). On a quiet machine a trial costs 8 steps at ~1.3x once per 512, but
# only where steps are plain: 1 thread verifies 16 rows ~1.8x slower, and a trial that fell on an answer
# copying its prompt (Gemma 3 270M, 16 steps of 16 rows) took it from 265 to 177 tok/s. So such a trial
# waits for a step that drafted nothing, and ends, unjudged, before the first step that drafts (before_step):
# it used to go on for its 8 steps, and on SmolLM2's copies those were 40-row verifies at 1 thread (add-docstring:
# 8 of its 34 steps, decode time 4.2 s against 2.6 predicted).
FIRST_QUIET_TRIAL_AFTER = 16
QUIET_TRIAL_EVERY = 512


class ThreadTuner:
    def __init__(self, full: int):
        self.full = full
        self.current = full
        self._recent: dict[int, deque[float]] = {}
        self._steps_here = 0
        self._trying: int | None = None  # the count on trial, judged against the one before it
        self._before: int | None = None
        self._probed = False  # the first trial without contention has been made
        self._quiet_trial = False  # the trial on now was not prompted by contention

    def record(self, per_row_seconds: float, contended: bool, drafted: bool = False) -> int | None:
        """One step's cost in one-row steps' seconds (and whether it verified drafts); returns a thread count
        to switch to, or None."""
        self._recent.setdefault(self.current, deque(maxlen=TRIAL_STEPS)).append(per_row_seconds)
        self._steps_here += 1
        if self._trying is not None and self._before is not None:  # a trial (_try sets both)
            if self._steps_here < TRIAL_STEPS:
                return None
            tried, before = self._median(self._trying), self._median(self._before)
            assert tried is not None  # the steps of this trial were just recorded
            margin = TRIAL_MARGIN if self._trying < self._before else 1.0  # the full count needs no margin
            keep = self._trying if before is None or tried < margin * before else self._before
            self._trying, self._quiet_trial = None, False
            return self._switch(keep)
        if self.full < 2:
            return None
        probe_due = not drafted and self._steps_here >= (QUIET_TRIAL_EVERY if self._probed else FIRST_QUIET_TRIAL_AFTER)
        if self.current == self.full and self._steps_here >= TRIAL_STEPS and (contended or probe_due):
            self._probed = True
            self._quiet_trial = not contended
            return self._try(max(1, self.full // 2))
        if self.current < self.full and self._steps_here >= RETRY_EVERY:
            return self._try(self.full)
        return None

    def before_step(self, drafting: bool) -> int | None:
        """Called before each step's decode: a thread count to switch to first, or None. A trial of fewer threads
        on a quiet machine ends before a step that drafts (see FIRST_QUIET_TRIAL_AFTER)."""
        if drafting and self._quiet_trial and self._before is not None:  # only while fewer threads are on trial
            self._trying, self._quiet_trial = None, False
            return self._switch(self._before)
        return None

    def _median(self, threads: int) -> float | None:
        recent = self._recent.get(threads)
        return statistics.median(recent) if recent else None

    def _try(self, threads: int) -> int | None:
        self._trying, self._before = threads, self.current
        self._recent.pop(threads, None)  # judge it on fresh steps only
        return self._switch(threads)

    def _switch(self, threads: int) -> int | None:
        changed = threads != self.current
        self.current, self._steps_here = threads, 0
        return threads if changed else None
