"""An answer's progress as the window gets it: text batched to at most one signal per EMIT_EVERY_S (so a fast
model cannot flood the event loop), with a snapshot of its figures as plain data. The local engine, the
server's batch and a remote engine all feed it."""

from __future__ import annotations

import time
from collections.abc import Callable

EMIT_EVERY_S = 0.05  # ≤ 20 repaints a second, however fast the model
RATE_POINTS = 60  # the sparkline keeps at most this many (seconds, tokens/s) points


def rate_points(history) -> list[list[float]]:
    """At most RATE_POINTS of a (seconds, tokens/s) history, evenly spread, the last kept, rounded."""
    history = list(history or [])
    if len(history) > RATE_POINTS:
        step = len(history) / RATE_POINTS
        history = [history[int(i * step)] for i in range(RATE_POINTS - 1)] + [history[-1]]
    return [[round(t, 3), round(r, 2)] for t, r in history]


def snapshot(stats) -> dict:
    """What the GUI shows and saves of a GenerationStats: its figures as plain data, with the SHOWN ones of
    engine.figures (the memory label) added."""
    out = stats.to_dict()
    out["memory_label"] = stats.memory.label() if stats.memory else None
    out["rate_history"] = rate_points(out.get("rate_history"))
    return out


class ProgressBatch:
    """An answer's text segments, handed to the GUI at most every EMIT_EVERY_S with the stats of the moment
    (the chat's own loop, the server's batch and a remote engine feed it)."""

    def __init__(self, emit: Callable[[int, list, dict], None], rid: int):
        self.emit, self.rid = emit, rid
        self.pending: list[tuple[str, bool]] = []
        self.last = time.perf_counter()

    def add(self, segments: list, stats: Callable[[], dict]) -> None:
        self.pending += segments
        now = time.perf_counter()
        if now - self.last >= EMIT_EVERY_S:
            self.flush(stats())
            self.last = now

    def flush(self, stats: dict) -> None:
        if self.pending:
            self.emit(self.rid, self.pending, stats)
            self.pending = []
