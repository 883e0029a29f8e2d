"""What a target step of each size costs on this machine: timed once per model file, load settings and thread
count (kept a day by step_timings.py), before the planner bets on a size. The step loop calibrates through
calibrate_steps; the draft proposer times its own token with time_steps."""
from __future__ import annotations

import time
from typing import Callable

from . import step_timings
from .cost_model import (CALIBRATION_REPEATED_UP_TO, CALIBRATION_REPEATS, CALIBRATION_WARMUP, StepCosts,
                         calibration_sizes)
from .runtime import Model


def calibrate_steps(target: Model, steps: StepCosts, max_draft: int, slot: int, start: int, token: int,
                    sequences: int, timed_only: bool, clock: Callable[[], float] = time.perf_counter) -> None:
    """Give `steps` the time of every size `sequences` sequences may verify together (up to max_draft drafts
    each), unless it has them: timed in free cells from `start` of sequence `slot`, or with timed_only, only
    the sizes this model has timed before."""
    top = min(sequences * (max_draft + 1), target.n_batch, target.n_ctx - start - 1)
    sizes = calibration_sizes(top) if top >= 2 else []
    if timed_only:
        sizes = [rows for rows in sizes if (target.threads, rows) in target.step_timings]
    if not steps.calibrated and len(sizes) >= 2 and sizes[0] == 1:
        steps.take_calibration(time_steps(target, slot, start, token, sizes, clock))


def time_steps(target: Model, slot: int, start: int, token: int, sizes: list[int],
               clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Seconds of a step of each size (rows of `token` in free cells from `start` of sequence `slot`, rolled
    back after), warm: CALIBRATION_WARMUP untimed one-row steps first, then CALIBRATION_REPEATS rounds over
    the sizes (those past CALIBRATION_REPEATED_UP_TO in the first only), the fastest of each size kept.
    Rounds, not repeats back to back: this VM's speed wanders over seconds, and two timings of one size a
    round apart are less alike than two in a row (the curve's ratios to one row varied 11% between
    calibrations timed back to back, 5% in rounds, on SmolLM2 and Gemma 3 270M here).

    Timings are kept by model file and load settings (step_timings.py), by thread count: a size timed
    once is not timed again for a day (the server's start and stop, a speculation change, a reload: each
    had re-timed every size, up to a minute and a half on a busy machine, while the window waited)."""
    kept = target.step_timings
    missing = [rows for rows in sizes if (target.threads, rows) not in kept]
    if missing:
        kept.update({(target.threads, rows): seconds
                     for rows, seconds in time_sizes(target, slot, start, token, missing, clock).items()})
        step_timings.save()
    return {rows: kept[target.threads, rows] for rows in sizes}


def time_decode(target: Model, slot: int, start: int, token: int, rows: int,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of one decode of `rows` rows of `token` in free cells from `start` of sequence `slot`, rolled
    back after."""
    t = clock()
    target.decode_multi([token] * rows, range(start, start + rows), [slot] * rows, [True] * rows)
    spent = clock() - t
    target.forget_from(start, slot)
    return spent


def time_sizes(target: Model, slot: int, start: int, token: int, sizes: list[int],
               clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """The timing itself, every size afresh: nothing is read from or kept in the model's timings."""
    def timed(rows: int) -> float:
        return time_decode(target, slot, start, token, rows, clock)

    for _ in range(CALIBRATION_WARMUP):
        timed(1)
    timed(max(sizes))  # untimed: the widest batch yet grows llama.cpp's buffers (Gemma, 32 rows: 109 ms, then 89)
    fastest: dict[int, float] = {}
    for round_ in range(CALIBRATION_REPEATS):
        for rows in sizes:
            if round_ == 0 or rows <= CALIBRATION_REPEATED_UP_TO:
                fastest[rows] = min(fastest.get(rows, float("inf")), timed(rows))
    return fastest
