"""How an answer compares with plain decoding on this machine, and the guard that stops speculating within an
answer that runs below it.

speedup_vs_plain = what plain decoding would have taken for the answer's tokens ÷ what they took. The first is
predicted from the plain steps this loop has decoded (their wall time, by context position, at this thread
count and this many sequences: a plain step slows as the context grows, ~9 ms at position 0 and ~17 at 400 for
SmolLM2 here); before there are any, from the calibrated one-row step time. Both sides are timed the same way:
a step from planning to its tokens, drafting included. It is an estimate, and the stats line says so.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

PLAIN_MEMORY = 64  # recent plain steps whose slope tells how a step grows with the context
RECENT_PLAIN = 8  # the latest plain steps, which set the level: how fast this machine is now
PLAIN_FRESH_S = 30.0  # older plain steps say nothing of now (another program may have started or stopped)
MIN_PLAIN_SAMPLES = 3  # fewer fresh ones: the calibrated step time stands in
MIN_SLOPE_SPAN = 32  # positions between the samples' halves before their slope is believed
# The guard: over a sequence's last steps (at most GUARD_WINDOW, at least GUARD_MIN_STEPS holding GUARD_MIN_TOKENS
# tokens, one of them drafting) the answer ran below GUARD_BELOW x plain, and so far no faster than plain in all: it
# decodes plainly for GUARD_BACKOFF_STEPS steps, twice as many each time it happens again. Steps, not tokens alone:
# where speculation loses, a step makes little more than one token (the Qwen2.5-Coder pair on sql-rename: 1.03 a
# step at 0.89x plain), and a window asking for 2 a step never judged it.
# Only while the answer as a whole runs no faster than plain (GUARD_AHEAD): an answer well ahead loses a little
# in a window where a copy ends and its long drafts fail, and the planner's own realism already answers that; held
# 16 steps it lost the next copy too (Gemma 3's fix-json, lookup: 1.51x plain unguarded, 1.23x with a guard that
# tripped in every run on the windows alone).
GUARD_AHEAD = 1.0
GUARD_WINDOW = 16
GUARD_MIN_STEPS = 6
GUARD_MIN_TOKENS = 8
GUARD_BELOW = 0.95
GUARD_BACKOFF_STEPS = 16


class PlainPace:
    """Seconds of a plain step by sequences in the step and context position, learned from the plain steps
    decoded: the latest fresh ones give the level, the longer memory the slope; forgotten when the thread count
    changes (a step on one thread takes about twice as long)."""

    def __init__(self) -> None:
        self._samples: dict[int, deque[tuple[float, float, float]]] = {}  # sequences -> (position, seconds, when)
        self._threads: int | None = None

    def record(self, sequences: int, threads: int, position: float, seconds: float, now: float) -> None:
        if threads != self._threads:
            self._samples.clear()
            self._threads = threads
        self._samples.setdefault(sequences, deque(maxlen=PLAIN_MEMORY)).append((position, seconds, now))

    def predict(
        self, sequences: int, threads: int, position: float, fallback: float | None, now: float
    ) -> float | None:
        """A plain step's seconds here now; `fallback` (the calibrated time) without enough fresh plain steps."""
        samples = self._samples.get(sequences) if threads == self._threads else None
        fresh = [s for s in samples or () if now - s[2] <= PLAIN_FRESH_S][-RECENT_PLAIN:]
        if len(fresh) < MIN_PLAIN_SAMPLES:
            return fallback
        assert samples is not None  # fresh came from them
        level_at = sum(x for x, _, _ in fresh) / len(fresh)
        level = sum(y for _, y, _ in fresh) / len(fresh)  # a mean: a slow step now and then is part of the cost
        positions = [x for x, _, _ in samples]
        reach = max(positions) - min(positions)  # never read further from the samples than they span
        return max(level + _slope(samples) * max(-reach, min(reach, position - level_at)), 1e-6)


def _slope(samples: Iterable[tuple[float, float, float]]) -> float:
    """Seconds per position between the later and the earlier half of the samples (by position), where they lie
    far enough apart to show one; never below 0."""
    ordered = sorted((x, y) for x, y, _ in samples)
    half = len(ordered) // 2
    early, late = ordered[:half], ordered[half:]
    if not early:
        return 0.0
    apart = sum(x for x, _ in late) / len(late) - sum(x for x, _ in early) / len(early)
    if apart < MIN_SLOPE_SPAN:
        return 0.0
    return max(0.0, (sum(y for _, y in late) / len(late) - sum(y for _, y in early) / len(early)) / apart)


@dataclass
class SequencePace:
    """One answer's time against plain decoding's predicted time, and its guard."""

    actual_s: float = 0.0
    plain_s: float = 0.0
    # (actual, plain, drafted, tokens) of the latest steps
    window: deque[tuple[float, float, bool, int]] = field(default_factory=lambda: deque(maxlen=GUARD_WINDOW))
    plain_steps_left: int = 0  # the guard holds speculation off for this many more steps
    backoffs: int = 0
    note: str | None = None  # what the guard did, for the stats

    @property
    def speedup(self) -> float | None:
        return self.plain_s / self.actual_s if self.actual_s > 0 and self.plain_s > 0 else None

    def record(self, actual: float, plain: float, drafted: bool, tokens: int = 1) -> None:
        self.actual_s += actual
        self.plain_s += plain
        self.window.append((actual, plain, drafted, tokens))
        if self.plain_steps_left:
            self.plain_steps_left -= 1
            return
        w = self.window
        if len(w) >= GUARD_MIN_STEPS and sum(t for *_, t in w) >= GUARD_MIN_TOKENS and any(d for _, _, d, _ in w):
            ratio = sum(p for _, p, _, _ in w) / sum(a for a, *_ in w)
            if ratio < GUARD_BELOW and self.plain_s <= GUARD_AHEAD * self.actual_s:
                self.plain_steps_left = GUARD_BACKOFF_STEPS * 2**self.backoffs
                self.backoffs += 1
                self.window.clear()
                times = f" ({self.backoffs} times)" if self.backoffs > 1 else ""
                self.note = f"backed off{times}: ran at {ratio:.2f}× plain"

    @property
    def holding(self) -> bool:
        """The guard keeps this sequence plain for now."""
        return self.plain_steps_left > 0
