"""A lab run's cells by method and concurrency, each method's speed-up over plain decoding at each level, and the
crossover: where speculation stops paying as concurrency rises. Pure functions of the results document."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..methods import method_words as registry_words
from .compare import PAYS, compare_cells, throughput

METHOD_WORDS = registry_words("prose")
METHOD_COLOURS = registry_words("colour")


def method_words(method: str) -> str:
    """A method in words; a server of a remote run (engine/lab/remote.py) by the name it was given."""
    return METHOD_WORDS.get(method, method)


def threads_words(env: dict) -> str:
    if env.get("remote"):
        return "the servers' own threads"
    n = env.get("threads", "?")
    return f"{n} thread{'' if n == 1 else 's'}"


def where_words(env: dict) -> str:
    if env.get("remote"):
        return f"On the servers ({', '.join(f'{n} {u}' for n, u in env.get('servers', {}).items())})"
    return f"On this machine ({env.get('backend', '?')}, {threads_words(env)})"


def cell_map(results: dict) -> dict[tuple[str, int], dict]:
    return {(c["method"], c["concurrency"]): c for c in results["cells"]}


def levels(results: dict) -> list[int]:
    return sorted({c["concurrency"] for c in results["cells"]})


def methods(results: dict) -> list[str]:
    seen: list[str] = []
    for c in results["cells"]:
        if c["method"] not in seen:
            seen.append(c["method"])
    return seen


def least_disturbed(runs: list[dict]) -> dict:
    """Of repeated runs of one cell (the lab's, or against servers), the fastest: other work on the machine only
    ever slows a run down. Every run's throughput stays in the cell, so the spread is visible."""
    fastest = max(runs, key=lambda c: throughput(c) or 0.0)
    best = dict(fastest)
    best["repeats"] = len(runs)
    best["aggregate_tokens_per_s_runs"] = [c["aggregate_tokens_per_s"] for c in runs]
    best["full_tokens_per_s_runs"] = [c.get("full_tokens_per_s") for c in runs]
    return best


def speedups(results: dict, method: str, base: str = "none") -> list[tuple[int, float]]:
    """(concurrency, throughput of method ÷ plain decoding's (base's)) where both were measured."""
    cells = cell_map(results)
    out = []
    for level in levels(results):
        spec, plain = cells.get((method, level)), cells.get((base, level))
        found = compare_cells(spec, plain).get("throughput") if spec else None
        if found:
            out.append((level, found.ratio))
    return out


@dataclass(frozen=True)
class Crossover:
    method: str
    speedups: list[tuple[int, float]]
    pays_up_to: int | None  # the highest level up to which the method paid (see PAYS) at every level
    stops_at: int | None  # the first level where it did not: the crossover, as measured
    estimate: float | None  # where the speed-up falls to PAYS, interpolated on a log2 concurrency axis

    def to_dict(self) -> dict:
        return {
            "pays_up_to": self.pays_up_to,
            "stops_at": self.stops_at,
            "estimate": self.estimate,
            "speedups": {str(c): r for c, r in self.speedups},
        }


def crossover(results: dict, method: str, base: str = "none") -> Crossover | None:
    ratios = speedups(results, method, base)
    if not ratios:
        return None
    pays_up_to = stops_at = None
    for level, ratio in ratios:
        if ratio < PAYS:
            stops_at = level
            break
        pays_up_to = level
    estimate = None
    if pays_up_to is not None and stops_at is not None:
        r0, r1 = dict(ratios)[pays_up_to], dict(ratios)[stops_at]
        x0, x1 = math.log2(pays_up_to), math.log2(stops_at)
        estimate = 2 ** (x0 + (r0 - PAYS) / (r0 - r1) * (x1 - x0))
    return Crossover(method, ratios, pays_up_to, stops_at, estimate)
