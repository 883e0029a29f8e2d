"""A method against plain decoding, measure by measure: the one place the lab's ratios come from, so the table's
"× plain" figures and the verdict above it are the same numbers (advice.py words them, app/lab/results_table.py
shows them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# A lead of 5% or more "pays": repeated runs of one cell on this shared 2-core machine differ by about that much,
# so a smaller lead either way is a tie.
PAYS = 1.05
# A sample this small says so: fewer generated tokens than this in a cell, or one run per cell (no spread to
# see). On this machine one 192-token cell moved by 17% between runs.
SMALL_SAMPLE_TOKENS = 1024


def throughput(cell: dict) -> float | None:
    """The tokens/s a level is judged by: decode throughput with every slot busy where that was measured (metrics.py;
    servers: serve_cell.full_load_rate), else the aggregate (results saved before it was measured)."""
    return cell.get("full_tokens_per_s") or cell.get("aggregate_tokens_per_s")


def throughput_words(cell: dict) -> str:
    return "throughput at full load" if cell.get("full_tokens_per_s") else "aggregate throughput"


@dataclass(frozen=True)
class Measure:
    key: str
    words: str  # what the verdict calls it
    unit: str
    read: Callable[[dict], float | None]
    higher_is_better: bool


MEASURES = {
    m.key: m
    for m in (
        Measure("per_request", "per-request tok/s", "tok/s", lambda c: c.get("per_request_tokens_per_s"), True),
        Measure("throughput", "throughput", "tok/s", throughput, True),
        Measure("latency", "ITL p50", "ms", lambda c: c.get("itl_p50_ms"), False),
    )
}


@dataclass(frozen=True)
class Comparison:
    measure: str  # a MEASURES key
    value: float  # the method's
    plain: float  # plain decoding's, at the same concurrency

    @property
    def ratio(self) -> float:
        """Above 1: the method did better than plain decoding (more tok/s, or fewer ms per token)."""
        m = MEASURES[self.measure]
        return self.value / self.plain if m.higher_is_better else self.plain / self.value

    @property
    def standing(self) -> str:
        return "ahead" if self.ratio >= PAYS else "behind" if self.ratio <= 1 / PAYS else "tie"

    def ratio_text(self) -> str:
        return f"{self.ratio:.2f}×"

    def text(self) -> str:
        """e.g. '1.02× (41.5 vs 40.7 tok/s)', the method's figure first; a latency as '20.3 vs 23.8 ms, 1.17× as
        fast' (plain decoding's ms ÷ the method's)."""
        unit = MEASURES[self.measure].unit
        if not MEASURES[self.measure].higher_is_better:
            return f"{self.value:.1f} vs {self.plain:.1f} {unit}, {self.ratio_text()} as fast"
        return f"{self.ratio_text()} ({self.value:.1f} vs {self.plain:.1f} {unit})"


def compare_cells(cell: dict, plain: dict | None) -> dict[str, Comparison]:
    """Each measure both cells have, the method's against plain decoding's; empty for plain decoding itself."""
    if plain is None or cell["method"] == plain["method"]:
        return {}
    out = {}
    for key, m in MEASURES.items():
        value, base = m.read(cell), m.read(plain)
        if value and base:  # n/a, or zero, compares with nothing
            out[key] = Comparison(key, float(value), float(base))
    return out


def compare(results: dict, base: str = "none") -> dict[tuple[str, int], dict[str, Comparison]]:
    """(method, concurrency) → its comparisons with `base` at that concurrency, for every measured cell."""
    plain = {c["concurrency"]: c for c in results["cells"] if c["method"] == base}
    return {
        (c["method"], c["concurrency"]): compare_cells(c, plain.get(c["concurrency"]))
        for c in results["cells"]
        if c["method"] != base
    }


def sample_note(results: dict) -> str | None:
    """Words for a sample too small to rest a decision on (the rule above), else None."""
    cells = results["cells"]
    tokens = min((c.get("generated_tokens") or 0 for c in cells), default=0)
    runs = min((c.get("repeats") or 1 for c in cells), default=1)
    if tokens >= SMALL_SAMPLE_TOKENS and runs > 1:
        return None
    why = []
    if tokens < SMALL_SAMPLE_TOKENS:
        why.append(f"{tokens} tokens in the smallest cell, under {SMALL_SAMPLE_TOKENS}")
    if runs <= 1:
        why.append("one run per cell, so no spread was seen")
    return (
        f"Small sample ({'; '.join(why)}): treat this as a hint. Raise tokens per request or Repeats "
        "for a verdict that holds."
    )


def spread_note(results: dict) -> str | None:
    """With repeated runs: how far the runs of one cell were apart (the largest gap, as a share of the fastest)."""
    gaps = []
    for c in results["cells"]:
        runs = [r for r in (c.get("full_tokens_per_s_runs") or c.get("aggregate_tokens_per_s_runs") or []) if r]
        if len(runs) > 1:
            gaps.append((max(runs) - min(runs)) / max(runs))
    if not gaps:
        return None
    return f"Runs of one cell were up to {max(gaps):.0%} apart."
