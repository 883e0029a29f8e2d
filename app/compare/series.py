"""Compare measures like a benchmark: pairs of runs, plain and speculative, their order alternating from pair to
pair (plain first, then speculative first, …) so that neither side always gets the warmer machine. Each pair gives
one ratio of speeds; the series reports their median and range, and runs more pairs while they disagree widely,
within a pair cap and a time cap."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

PLAIN, SPECULATIVE = "plain", "speculative"
MIN_PAIRS = 3  # a median needs three to stand against one odd pair
MAX_PAIRS = 8
TIME_CAP_S = 60.0  # no pair is begun after this long (the first MIN_PAIRS always run)
# The fastest pair's ratio over the slowest's above this: the runs disagree widely, and one figure would mislead.
NOISY_SPREAD = 1.5


def first_difference(a: list[tuple[str, bool]], b: list[tuple[str, bool]]) -> tuple[int, int] | None:
    """Where two streamed texts part: (token index in a, character offset), or None if they are equal.
    Segments are the engine's (text, source) pairs, one per token (text held back while it might
    begin a stop string arrives joined, so the index can be a token early there)."""
    text_a, text_b = "".join(t for t, _ in a), "".join(t for t, _ in b)
    if text_a == text_b:
        return None
    chars = next((i for i, (x, y) in enumerate(zip(text_a, text_b)) if x != y), min(len(text_a), len(text_b)))
    token, end = 0, 0
    for text, _ in a:
        end += len(text)
        if end > chars:
            break
        token += 1
    return token, chars


def speed_ratio(plain: dict, speculative: dict) -> float | None:
    p, s = plain.get("tokens_per_s"), speculative.get("tokens_per_s")
    return s / p if p and s else None


@dataclass
class Run:
    segments: list[tuple[str, bool]] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    others_share: float | None = None  # other programs' share of the CPU during this run (cpu_load)


@dataclass
class Pair:
    first: str  # PLAIN or SPECULATIVE: which ran first
    runs: dict[str, Run] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return len(self.runs) == 2

    @property
    def ratio(self) -> float | None:
        return speed_ratio(self.runs[PLAIN].stats, self.runs[SPECULATIVE].stats) if self.done else None

    @property
    def parted(self) -> tuple[int, int] | None:
        return first_difference(self.runs[PLAIN].segments, self.runs[SPECULATIVE].segments) if self.done else None

    @property
    def others_share(self) -> float | None:
        shares = [r.others_share for r in self.runs.values() if r.others_share is not None]
        return max(shares) if shares else None


class Series:
    """The pairs of one comparison, and when to stop adding them."""

    def __init__(self, clock=time.monotonic):
        self.pairs: list[Pair] = []
        self.clock = clock
        self.started = clock()
        self.capped = ""  # why pairs stopped being added early, in words ("" when the spread settled)

    def next_kind(self) -> str | None:
        """The run to send next, or None when the series is complete."""
        if self.pairs and not self.pairs[-1].done:
            return SPECULATIVE if PLAIN in self.pairs[-1].runs else PLAIN
        if not self._wants_another():
            return None
        first = PLAIN if len(self.pairs) % 2 == 0 else SPECULATIVE
        self.pairs.append(Pair(first))
        return first

    def _wants_another(self) -> bool:
        if len(self.pairs) < MIN_PAIRS:
            return True
        if not self.wide:
            return False
        if len(self.pairs) >= MAX_PAIRS:
            self.capped = f"stopped at the cap of {MAX_PAIRS} pairs"
            return False
        if self.clock() - self.started >= TIME_CAP_S:
            self.capped = f"stopped at the {TIME_CAP_S:g} s time cap"
            return False
        return True

    def record(self, kind: str, run: Run) -> None:
        self.pairs[-1].runs[kind] = run

    @property
    def done_pairs(self) -> list[Pair]:
        return [p for p in self.pairs if p.done]

    @property
    def ratios(self) -> list[float]:
        return [r for r in (p.ratio for p in self.done_pairs) if r is not None]

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def low(self) -> float | None:
        return min(self.ratios) if self.ratios else None

    @property
    def high(self) -> float | None:
        return max(self.ratios) if self.ratios else None

    @property
    def wide(self) -> bool:
        """The pairs disagree widely: the fastest ratio is over NOISY_SPREAD times the slowest."""
        ratios = self.ratios
        return len(ratios) >= 2 and max(ratios) > NOISY_SPREAD * min(ratios)

    def runs(self, kind: str) -> list[Run]:
        return [p.runs[kind] for p in self.pairs if kind in p.runs]
