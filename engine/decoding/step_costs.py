"""Seconds of one target step by the rows it verifies (all sequences' rows together), as the planner predicts them.

A step's time = base(rows) x drift. The base curve is the machine's and the model's, timed once per size up front
(calibration.py); the drift (the median of recent steps' actual / base) follows what the base cannot: a longer
context, fewer threads, another program on the cores. The base is never rewritten from the drift, so the two cannot
chase each other: a server whose batch never takes a one-row step still predicts one right when its last client is
alone (it did not, while both were learned together: 2c9b522). Estimates are medians of recent steps, so an outlier
(a busy core, a page fault) does not steer the plan.

Figures below are from this project's 2-core x86 CPU unless they say otherwise (docs/benchmarks.md).
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque

# Recent observations whose median is an estimate (the drift, the drafted factor, the draft's timings): odd, so the
# median is one of them, and short, so a lasting change shows within five steps (chosen in fa010b1, not swept).
MEDIAN_WINDOW = 9  # observations in each median estimate of a step's or a draft's cost
# A median is read once this many observations are in: below it, one odd step would set it (2c9b522, 1b8117e).
FEWEST_FOR_MEDIAN = 3  # observations before the drafted factor and the quiet mark are read
# A calibration counts as this many steps at drift 1: the first live steps nudge the drift, not set it (2c9b522).
CALIBRATION_AS_STEPS = 3  # drift-1 observations a calibration seeds the drift's median with
# Beyond the largest size known: the cheaper of the last measured slope and a power law r^0.5, optimistic on purpose
# so that long drafts get tried and so measured (d97e1cf). Measured on this 2-core CPU, Gemma 3 270M: 2 rows 2.1x,
# 8 rows 3.8x, 16 rows 5.1x, 32 rows 9.1x one row.
ROW_COST_EXPONENT = 0.5  # power law of a step's cost in its rows, past the widest size timed (optimistic: d97e1cf)
OPTIMISTIC_ROW_COST = 0.1  # before any multi-row step, each extra row's share of a one-row step (a GPU's figure)
# Another process is using the cores when plain steps' drift runs this much above the quietest of the last
# QUIET_MEMORY plain steps. Plain steps only, and a sliding memory, because a step also slows as the context
# grows (SmolLM2 with flash attention on this CPU: one row 9.1 ms at position 0, 17.1 at 400, 27.3 at 800)
# and a drafted step more so (24 rows 112.8, 257.5, 445.0 ms): judged on every step against the quietest
# ever, answers that copied tripped the alarm every few dozen steps, and each false trial verified its
# drafts on one thread (49 rows: 1.0 s against 0.53; repeat-email 52 tok/s against 112). Nor is calibration
# the quiet mark: it decodes in an empty cache, and the first live steps ran 1.6x it (7c1c7c9).
CONTENDED = 1.6  # plain steps this much slower than the quiet mark: another program has the cores (7c1c7c9)
QUIET_MEMORY = 64  # plain-step medians the quiet mark is the least of: a sliding memory, as the context grows (7c1c7c9)
# Steps that verify drafts cost more live than their calibrated base says, beyond the drift that the
# (mostly one-row) plain steps set: on Gemma 3 270M here, after one-row steps, 4 rows took 2.9 one-row steps
# against 2.44 calibrated, 8 rows 4.1 against 3.35, 16 rows 6.2 against 5.2 (a wide step after narrow ones
# finds colder caches, and calibration keeps each size's fastest). So drafted steps keep their own factor over
# base x drift, the median of recent ones, and the planner prices draft rows with it.
DRAFTED_FACTOR_RANGE = (0.8, 1.5)  # bounds of drafted steps' cost over base x drift (Gemma 3 270M ran ~1.2; 1b8117e)


class StepCosts:
    """Seconds of one target step by rows verified (all sequences' rows together)."""

    def __init__(self) -> None:
        self._base: dict[int, float] = {}  # rows -> seconds, calibrated (or, uncalibrated, first seen)
        self._drift: deque[float] = deque(maxlen=MEDIAN_WINDOW)  # recent steps' actual / base
        self._drift_now = 1.0  # their median, kept current: the planner reads it dozens of times a step
        self._drafted: deque[float] = deque(maxlen=MEDIAN_WINDOW)  # recent drafted steps' actual / (base x drift)
        self.drafted_factor = 1.0  # their median, once FEWEST_FOR_MEDIAN are in (DRAFTED_FACTOR_RANGE)
        self._plain: deque[float] = deque(maxlen=MEDIAN_WINDOW)  # recent plain steps' actual / base, since a reset
        self._quiet: deque[float] = deque(maxlen=QUIET_MEMORY)  # their medians, once FEWEST_FOR_MEDIAN are in
        self._rows: list[int] = []  # the base's sizes, sorted, and their seconds: rebuilt on change
        self._secs: list[float] = []
        self._known: dict[int, float] = {}  # _base_of's answers, kept until the base changes (read ~50x a plan)
        self.calibrated = False  # take_calibration() has run

    def record(self, rows: int, seconds: float, drafted: bool = False) -> float:
        """Take one step's time (drafted: it verified drafts); returns it in one-row steps' seconds (the
        thread tuner compares those)."""
        if not self.calibrated and rows not in self._base:  # learn the base from the first step of a size
            self._set_base({**self._base, rows: seconds / self.drift})
        ratio = seconds / self._base_of(rows)
        if drafted:
            self._drafted.append(ratio / self._drift_now)
            if len(self._drafted) >= FEWEST_FOR_MEDIAN:
                low, high = DRAFTED_FACTOR_RANGE
                self.drafted_factor = min(high, max(low, statistics.median(self._drafted)))
        else:
            self._plain.append(ratio)
            if len(self._plain) >= FEWEST_FOR_MEDIAN:
                self._quiet.append(statistics.median(self._plain))
        self._drift.append(ratio)
        self._drift_now = statistics.median(self._drift)
        return ratio * self._base_of(1)

    def take_calibration(self, timings: dict[int, float]) -> None:
        """Take a measured curve: seconds by rows, with rows = 1 among them."""
        self.calibrated = True
        self._set_base(dict(timings))
        self.rescale()
        self._drift.extend([1.0] * CALIBRATION_AS_STEPS)

    def rescale(self) -> None:
        """The machine changed (fewer threads): keep the base curve, measure the drift and the quiet mark afresh."""
        self._drift.clear()
        self._drift_now = 1.0
        self._plain.clear()
        self._quiet.clear()

    def _set_base(self, base: dict[int, float]) -> None:
        self._base = base
        self._rows, self._secs = map(list, zip(*sorted(base.items())))
        self._known = {}

    @property
    def drift(self) -> float:
        return self._drift_now

    def measured(self, rows: int) -> bool:
        return bool(self._drift) and (rows in self._base or (self.calibrated and rows >= 1))

    @property
    def contended(self) -> bool:
        """Plain steps are much slower than this machine managed on them lately."""
        return bool(self._quiet) and self._quiet[-1] > CONTENDED * min(self._quiet)

    def seconds(self, rows: int, drafted: bool = False) -> float | None:
        """Predicted seconds of a step of `rows` rows; drafted: one that verifies drafts."""
        if not self._base:
            return None
        return self._base_of(rows) * self._drift_now * (self.drafted_factor if drafted else 1.0)

    def measured_seconds(self, rows: int, drafted: bool = False) -> float:
        """seconds(), where a step has been measured (the planner asks only past its measured() check)."""
        seconds = self.seconds(rows, drafted)
        assert seconds is not None, "no step measured yet"
        return seconds

    def plain_seconds(self, rows: int) -> float | None:
        """Predicted seconds of a plain step of `rows` rows from plain steps alone: the base times their recent
        drift (1 before any). Not the planner's drift, which drafted steps move too: a verify dearer than its
        base must not make plain decoding look dear as well."""
        if not self._base:
            return None
        return self._base_of(rows) * (statistics.median(self._plain) if self._plain else 1.0)

    def _base_of(self, rows: int) -> float:
        """Seconds of a step of `rows` rows before drift: measured, interpolated, or extrapolated."""
        known = self._known.get(rows)
        if known is None:
            known = self._known[rows] = self._curve(rows)
        return known

    def _curve(self, rows: int) -> float:
        sizes, secs = self._rows, self._secs
        i = bisect.bisect_left(sizes, rows)
        if i < len(sizes) and sizes[i] == rows:
            return secs[i]
        if 0 < i < len(sizes):
            r0, r1, c0, c1 = sizes[i - 1], sizes[i], secs[i - 1], secs[i]
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
        r_top, c_top = sizes[-1], secs[-1]
        if i == 0:  # below the smallest size seen (uncalibrated): proportionally
            return c_top * rows / r_top if len(sizes) == 1 else secs[0] * rows / sizes[0]
        if len(sizes) == 1:
            return c_top * (1 + OPTIMISTIC_ROW_COST * (rows - 1)) / (1 + OPTIMISTIC_ROW_COST * (r_top - 1))
        r_prev, c_prev = sizes[-2], secs[-2]
        linear = c_top + max(c_top - c_prev, 0.0) * (rows - r_top) / (r_top - r_prev)
        power: float = (rows / r_top) ** ROW_COST_EXPONENT  # float ** float is typed as Any (it may be complex)
        return min(linear, c_top * power)
