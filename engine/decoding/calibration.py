"""What a target step of each size costs on this machine: timed once per model file, load settings and thread
count (kept a day by step_timings.py), before the planner bets on a size. The step loop calibrates through
calibrate_steps; the draft proposer times its own token with time_steps.

A timing may be cut short (the window's worker interrupts it when a message is sent: nobody waits on it). What
was timed is kept: each size timed in all its rounds joins the model's kept timings, and a size part-timed keeps
its fastest and rounds in memory, so the next calibration goes on where this one stopped. Meanwhile answers plan
on what has been timed so far (timing_deferred)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..methods import MAX_DRAFT_LIMIT
from . import step_timings
from .runtime import Model
from .step_costs import StepCosts

# --- which sizes are timed, and how often ------------------------------------------------------
# Calibration decodes untimed first: the first decode after a load or a pause ran ~25% slow (SmolLM2,
# 1 row: 6.9 ms against 5.5 after), and a slow one-row base made every verify look that much cheaper than
# it is (8 rows: 3.4 plain steps predicted, 4.9 paid), so drafts that lose were taken (8a2b122).
CALIBRATION_WARMUP = 2  # untimed one-row decodes before the timing starts (a cold first decode ran ~25% slow)
# A decode wider than any before grows llama.cpp's compute buffers: timed once in rising order, the wide sizes
# came out 15-23% dear (Gemma 3 270M, 32 rows: 97.7 ms, against 79.4 as the faster of two), which kept
# copies from drafting long. So the widest size is decoded once untimed first, and every size one sequence
# may verify is timed twice, in rounds over the sizes: the curve's ratios to one row varied 11% between
# calibrations timed back to back, 5% in rounds (4447e85, 6ac761e); wider ones (a batch of sequences) once.
CALIBRATION_REPEATS = 2  # rounds over the sizes, the fastest of each kept (once, wide sizes came out 15-23% dear)
CALIBRATION_REPEATED_UP_TO = MAX_DRAFT_LIMIT + 1  # sizes timed in every round: one sequence's widest verify
# The curve is not smooth (Gemma 3 Q4_K on this 2-core CPU verifies 16 rows for 5.2 one-row steps but 15 rows
# for 7.2), so every size up to 17 is timed, then every 8th to 64, then every 32nd (a batch of sequences; a
# 264-row step takes 0.6 s here), then the largest (fa010b1, 2c9b522).
CALIBRATION_EVERY_SIZE = 17  # sizes timed one by one, 1..17 (the curve jumps between neighbours)
CALIBRATION_STRIDE = 8  # past those, every 8th size up to CALIBRATION_WIDE_FROM
CALIBRATION_WIDE_FROM = 64  # past this, sizes are batches of sequences, spaced wider
CALIBRATION_WIDE_STRIDE = 32  # their spacing: a 264-row step takes 0.6 s on this CPU (2c9b522)


def calibration_sizes(max_rows: int) -> list[int]:
    """Rows to time up front: every size up to CALIBRATION_EVERY_SIZE, then every CALIBRATION_STRIDE-th to
    CALIBRATION_WIDE_FROM, then every CALIBRATION_WIDE_STRIDE-th, then max_rows."""
    first_strided = (CALIBRATION_EVERY_SIZE // CALIBRATION_STRIDE + 1) * CALIBRATION_STRIDE
    sizes = list(range(1, min(max_rows, CALIBRATION_EVERY_SIZE) + 1))
    sizes += range(first_strided, min(max_rows, CALIBRATION_WIDE_FROM) + 1, CALIBRATION_STRIDE)
    sizes += range(CALIBRATION_WIDE_FROM + CALIBRATION_WIDE_STRIDE, max_rows + 1, CALIBRATION_WIDE_STRIDE)
    if sizes[-1] < max_rows:
        sizes.append(max_rows)
    return sizes


# on_progress(done, total, seconds_left): timings done (one per size and round) of those the curve needs, and
# the seconds the rest should take, an estimate from the timings so far (None until three sizes are timed).
Progress = Callable[[int, int, "float | None"], None]

# A timing cut short, by model (a reload starts afresh): its thread count and each size's (fastest, rounds).
_unfinished: weakref.WeakKeyDictionary[Model, tuple[int, dict[int, tuple[float, int]]]] = weakref.WeakKeyDictionary()
_deferred: weakref.WeakSet[Model] = weakref.WeakSet()  # models whose answers may not wait on a timing
# Step costs given a curve that lacks sizes while deferred, and how many sizes it had: completed afterwards.
_incomplete: weakref.WeakKeyDictionary[StepCosts, int] = weakref.WeakKeyDictionary()


def rounds_of(rows: int) -> int:
    """Timings a size gets: every round up to one sequence's widest verify, the first only beyond."""
    return CALIBRATION_REPEATS if rows <= CALIBRATION_REPEATED_UP_TO else 1


@contextmanager
def timing_deferred(target: Model) -> Iterator[None]:
    """While inside, calibrate_steps on `target` times nothing: the curve is what has been timed so far (wider
    sizes extrapolated; with fewer than two, each size is learnt from its first step), and the first calibration
    after this completes it. For an answer sent while its steps were being timed (app/worker.py)."""
    _deferred.add(target)
    try:
        yield
    finally:
        _deferred.discard(target)


def calibrate_steps(
    target: Model,
    steps: StepCosts,
    max_draft: int,
    slot: int,
    start: int,
    token: int,
    sequences: int,
    timed_only: bool,
    clock: Callable[[], float] = time.perf_counter,
    on_progress: Progress | None = None,
) -> None:
    """Give `steps` the time of every size `sequences` sequences may verify together (up to max_draft drafts
    each), unless it has them: timed in free cells from `start` of sequence `slot`, or with timed_only (or
    while timing_deferred), only the sizes this model has timed so far."""
    if steps.calibrated and steps not in _incomplete:
        return
    top = min(sequences * (max_draft + 1), target.n_batch, target.n_ctx - start - 1)
    sizes = calibration_sizes(top) if top >= 2 else []
    if len(sizes) < 2:
        return
    deferred = target in _deferred
    if timed_only or deferred:
        curve = timed_so_far(target, sizes)
        if len(curve) >= 2 and 1 in curve and len(curve) > _incomplete.get(steps, 0):  # new sizes only: taking
            # a curve afresh resets the drift the answer's steps measured
            steps.take_calibration(curve)
            if deferred and len(curve) < len(sizes):  # not the server's timed_only: it never times while serving
                _incomplete[steps] = len(curve)
            else:
                _incomplete.pop(steps, None)
        return
    steps.take_calibration(time_steps(target, slot, start, token, sizes, clock, on_progress))
    _incomplete.pop(steps, None)


def timed_so_far(target: Model, sizes: list[int]) -> dict[int, float]:
    """Seconds of each of `sizes` this model has timed at its thread count: kept, or part-timed by a timing cut
    short (its fastest yet)."""
    kept, threads = target.step_timings, target.threads
    threads_then, begun = _unfinished.get(target, (threads, {}))
    part = {rows: fastest for rows, (fastest, _) in begun.items()} if threads_then == threads else {}
    return {
        rows: kept[threads, rows] if (threads, rows) in kept else part[rows]
        for rows in sizes
        if (threads, rows) in kept or rows in part
    }


def time_steps(
    target: Model,
    slot: int,
    start: int,
    token: int,
    sizes: list[int],
    clock: Callable[[], float] = time.perf_counter,
    on_progress: Progress | None = None,
) -> dict[int, float]:
    """Seconds of a step of each size (rows of `token` in free cells from `start` of sequence `slot`, rolled
    back after), warm: CALIBRATION_WARMUP untimed one-row steps first, then CALIBRATION_REPEATS rounds over
    the sizes (those past CALIBRATION_REPEATED_UP_TO in the first only), the fastest of each size kept.
    Rounds, not repeats back to back: this VM's speed wanders over seconds, and two timings of one size a
    round apart are less alike than two in a row (the curve's ratios to one row varied 11% between
    calibrations timed back to back, 5% in rounds, on SmolLM2 and Gemma 3 270M here).

    Timings are kept by model file and load settings (step_timings.py), by thread count: a size timed
    once is not timed again for a day (the server's start and stop, a speculation change, a reload: each
    had re-timed every size, up to a minute and a half on a busy machine, while the window waited). A timing
    cut short (GenerationCancelled from the model's interrupt) keeps what it timed, and the next goes on from
    there, at the thread count it began with."""
    kept = target.step_timings
    threads, begun = _unfinished.get(target, (target.threads, {}))
    if any(kept.get((threads, rows)) is None for rows in sizes) and threads != target.threads:
        with _threads(target, threads):  # a thread trial since the cut: go on at the count the timing began at
            return time_steps(target, slot, start, token, sizes, clock, on_progress)
    threads = target.threads
    missing = [rows for rows in sizes if (threads, rows) not in kept]
    if missing:
        _unfinished[target] = (threads, begun)
        report = _reporter(timed_so_far(target, sizes), sizes, missing, begun, on_progress, clock)
        try:
            time_sizes(target, slot, start, token, missing, clock, begun, report)
        finally:
            for rows, (fastest, rounds) in list(begun.items()):
                if rounds >= rounds_of(rows):
                    kept[threads, rows] = fastest
                    del begun[rows]
            if not begun:
                _unfinished.pop(target, None)
            step_timings.save()
    return {rows: kept[threads, rows] for rows in sizes}


@contextmanager
def _threads(target: Model, threads: int) -> Iterator[None]:
    """The model on `threads` for a while, then back on the count it had."""
    before = target.threads
    target.set_threads(threads)
    try:
        yield
    finally:
        target.set_threads(before)


def _reporter(
    measured: dict[int, float],
    sizes: list[int],
    missing: list[int],
    begun: dict[int, tuple[float, int]],
    on_progress: Progress | None,
    clock: Callable[[], float],
) -> Callable[[int, float], None]:
    """on_timed for time_sizes: after each timing, on_progress with the timings done, of all, and an estimate
    of the seconds left. `measured` (seconds by rows so far) takes each timing at the time it took from the end
    of the one before, rollback and reporting included: by the decode alone, the estimate fell short by half on
    a busy machine (SmolLM2, 48 timings: 22 s left said, 50 s taken)."""
    if on_progress is None:
        return lambda rows, seconds: None
    total = sum(rounds_of(rows) for rows in sizes)
    last: list[float] = []  # the clock when the last timing was reported

    def report(rows: int = 0, seconds: float = 0.0) -> None:
        if rows:
            now = clock()
            measured[rows] = now - last[0] if last else seconds  # the first: its decode (the warm-ups came before)
            last[:] = [now]
        left = [rows for rows in missing for _ in range(rounds_of(rows) - begun.get(rows, (0.0, 0))[1])]
        on_progress(total - len(left), total, seconds_left(measured, left))

    report()  # where it starts: 0 of all, or where a timing cut short stopped
    return report


def seconds_left(measured: dict[int, float], left: list[int]) -> float | None:
    """An estimate of the seconds the timings `left` (rows each) take: a size measured at its last time, one
    not yet at the least-squares line through the sizes measured (never below the widest measured). None
    with fewer than three sizes measured (a line through two noisy ones said 3 min where 25 s were left),
    unless every size left is measured."""
    if all(rows in measured for rows in left):
        return sum(measured[rows] for rows in left)
    if len(measured) < 3:
        return None
    n = len(measured)
    mean_r, mean_s = sum(measured) / n, sum(measured.values()) / n
    slope = sum((r - mean_r) * (s - mean_s) for r, s in measured.items()) / sum((r - mean_r) ** 2 for r in measured)
    widest = measured[max(measured)]

    def predicted(rows: int) -> float:
        return measured[rows] if rows in measured else max(widest, mean_s + slope * (rows - mean_r))

    return sum(predicted(rows) for rows in left)


def time_decode(
    target: Model, slot: int, start: int, token: int, rows: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds of one decode of `rows` rows of `token` in free cells from `start` of sequence `slot`, rolled
    back after (also when the decode is interrupted)."""
    t = clock()
    try:
        target.decode_multi([token] * rows, range(start, start + rows), [slot] * rows, [True] * rows)
        return clock() - t
    finally:
        target.forget_from(start, slot)


def time_sizes(
    target: Model,
    slot: int,
    start: int,
    token: int,
    sizes: list[int],
    clock: Callable[[], float] = time.perf_counter,
    begun: dict[int, tuple[float, int]] | None = None,
    on_timed: Callable[[int, float], None] | None = None,
) -> dict[int, float]:
    """The timing itself: nothing is read from or kept in the model's timings. begun: each size's (fastest,
    rounds) from a timing cut short, updated after every timing (so it is current if this one is cut short
    too); a size goes on from the round it reached. on_timed(rows, seconds) after every timing."""
    begun = {} if begun is None else begun

    def timed(rows: int) -> float:
        return time_decode(target, slot, start, token, rows, clock)

    for _ in range(CALIBRATION_WARMUP):
        timed(1)
    timed(max(sizes))  # untimed: the widest batch yet grows llama.cpp's buffers (Gemma, 32 rows: 109 ms, then 89)
    for round_ in range(CALIBRATION_REPEATS):
        for rows in sizes:
            fastest, rounds = begun.get(rows, (float("inf"), 0))
            if rounds == round_ < rounds_of(rows):
                seconds = timed(rows)
                begun[rows] = (min(fastest, seconds), rounds + 1)
                if on_timed is not None:
                    on_timed(rows, seconds)
    return {rows: begun[rows][0] for rows in sizes}
