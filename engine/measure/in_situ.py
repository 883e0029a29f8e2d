"""Step costs as decoding pays them, for predictions (engine.measure.replay, engine.measure.gpu_kit).

The decode loop's calibration (calibration.time_sizes) keeps the fastest of rounds of steps timed one size after
another: a floor, which the planner corrects live with a factor of its own. A prediction has no live steps to
learn from, so its curve must be the expected cost itself: each size timed right after one-row steps (as a
drafted step follows plain ones while decoding), the mean of rounds but the slowest (one hiccup of another
program's does not count). The mean, not the median: some sizes' costs are bimodal here (Gemma 3's 16-row
step ran 96 or 129 ms as the median of five in two recordings a minute apart; live ones 101-155 ms), and a total
time follows the mean. On the Qwen2.5-Coder 1.5B here (2 cores), 17 rows took 293 ms fastest back to back,
351 ms as the median after one-row steps, and live 17-row steps of lookup's answers averaged ~350 ms; the floor
made replays over-predict lookup on the pair by 5-9%.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from ..decoding.calibration import time_decode
from ..decoding.runtime import Model

ROUNDS = 5
NARROW_BEFORE = 2  # one-row steps before each timed one


def time_in_situ(
    model: Model,
    start: int,
    token: int,
    sizes: list[int],
    rounds: int = ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[int, float]:
    """Seconds of a decode of each size (rows of `token` in free cells from `start` of sequence 0, rolled back
    after), each timed after NARROW_BEFORE one-row decodes: the mean of `rounds`, the slowest left out."""

    def decode(rows: int) -> float:
        return time_decode(model, 0, start, token, rows, clock)

    decode(1)
    decode(max(sizes))  # untimed: the widest batch grows llama.cpp's buffers once
    seen: dict[int, list[float]] = {rows: [] for rows in sizes}
    for _ in range(rounds):
        for rows in sizes:
            for _ in range(NARROW_BEFORE):
                decode(1)
            seen[rows].append(decode(rows))
    return {rows: statistics.mean(sorted(times)[:-1] if len(times) > 1 else times) for rows, times in seen.items()}
