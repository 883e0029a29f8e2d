"""The tables of docs/benchmarks.md's "Honest speed" section, from engine.measure.bench_compare's JSON (--out):
the engine's estimate (speedup_vs_plain) against the measured ratio, the guard's per-prompt table, and exact
greedy's identical answers and speed.

    python -m engine.measure.honest_speed NAME=FILE.json [NAME=FILE.json ...]

Measured ratio of a prompt: the median over its runs of method tok/s ÷ the plain tok/s measured beside it in the
same round (bench_compare.plain_beside: the methods interleaved with plain runs, their order rotated). Estimate of
a prompt: the median of its runs' speedup_vs_plain.
Per kind: geometric means over the kind's prompts.
"""

from __future__ import annotations

import json
import statistics
import sys

from .bench_compare import plain_beside

EXACT = "+exact"


def per_prompt(rows: list[dict], method: str) -> dict[str, dict]:
    """Prompt id -> its runs' measured ratios, estimates, guard notes and whether each answer was plain's."""
    out: dict[str, dict] = {}
    for row in rows:
        if method not in row or not row.get("none"):
            continue
        detail, plain = row[method + "_detail"], row["none_detail"]
        p = out.setdefault(row["id"], {"ratios": [], "estimates": [], "guards": 0, "same": []})
        p["ratios"].append(row[method] / plain_beside(row, method))
        if detail.get("speedup_vs_plain"):
            p["estimates"].append(detail["speedup_vs_plain"])
        p["guards"] += bool(detail.get("guard"))
        p["same"].append(detail.get("tokens") == plain.get("tokens"))
    return out


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return statistics.geometric_mean(values) if values else None


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def estimate_table(runs: dict[str, dict]) -> list[str]:
    lines = [
        "| model | kind | method | measured × plain | estimated × plain | estimate ÷ measured |",
        "|---|---|---|---|---|---|",
    ]
    for name, data in runs.items():
        kinds = data["kinds"]
        for method in data["methods"]:
            if method == "none" or method.endswith(EXACT):
                continue
            prompts = per_prompt(data["rows"], method)
            for kind in sorted(set(kinds.values())) + ["all"]:
                ids = [i for i in prompts if kind == "all" or kinds.get(i) == kind]
                measured = geomean([statistics.median(prompts[i]["ratios"]) for i in ids])
                estimated = geomean(
                    [statistics.median(prompts[i]["estimates"]) for i in ids if prompts[i]["estimates"]]
                )
                ratio = geomean(
                    [
                        statistics.median(prompts[i]["estimates"]) / statistics.median(prompts[i]["ratios"])
                        for i in ids
                        if prompts[i]["estimates"]
                    ]
                )
                lines.append(f"| {name} | {kind} | {method} | {fmt(measured)} | {fmt(estimated)} | {fmt(ratio)} |")
    return lines


def guard_table(runs: dict[str, dict]) -> list[str]:
    lines = [
        "| model | prompt | kind | method | median × plain (range) | runs the guard acted in |",
        "|---|---|---|---|---|---|",
    ]
    for name, data in runs.items():
        for method in data["methods"]:
            if method == "none" or method.endswith(EXACT):
                continue
            for prompt, p in per_prompt(data["rows"], method).items():
                r = p["ratios"]
                lines.append(
                    f"| {name} | {prompt} | {data['kinds'].get(prompt)} | {method} | "
                    f"{statistics.median(r):.2f} ({min(r):.2f}–{max(r):.2f}) | {p['guards']} of {len(r)} |"
                )
    return lines


def exact_table(runs: dict[str, dict]) -> list[str]:
    lines = [
        "| model | method | answers identical to plain | × plain (geomean) | with --exact: identical | "
        "with --exact: × plain |",
        "|---|---|---|---|---|---|",
    ]
    for name, data in runs.items():
        for method in data["methods"]:
            if method == "none" or method.endswith(EXACT) or method + EXACT not in data["methods"]:
                continue
            cells = []
            for m in (method, method + EXACT):
                prompts = per_prompt(data["rows"], m)
                same = sum(all(p["same"]) for p in prompts.values())
                speed = geomean([statistics.median(p["ratios"]) for p in prompts.values()])
                cells += [f"{same} of {len(prompts)}", fmt(speed)]
            lines.append(f"| {name} | {method} | " + " | ".join(cells) + " |")
    return lines


def load(spec: str) -> tuple[str, dict]:
    name, _, path = spec.partition("=")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = data["rows"]
    methods = [k for k in rows[0] if k.endswith("_detail")]
    data["methods"] = [m.removesuffix("_detail") for m in methods]
    data["kinds"] = data.get("kinds") or {}
    return name, data


def main(argv: list[str] | None = None) -> int:
    runs = dict(load(spec) for spec in (argv if argv is not None else sys.argv[1:]))
    for title, table in (
        ("Estimate against measurement", estimate_table(runs)),
        ("The guard, per prompt", guard_table(runs)),
        ("Exact greedy", exact_table(runs)),
    ):
        print(f"\n#### {title}\n")
        print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
