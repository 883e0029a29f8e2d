"""A replay's figures as tables: every method and baseline per answer (report, as_json), the prediction beside
live bench_compare figures of the same answers (check), and every replayed step of chosen answers (trace)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .recording import Recording
from .replay_bounds import any_copy_bound, hindsight_bound, replay_ngram_simple
from .replay_loop import REPLAYED, TracedStep, replay_lookup, replay_method


def speed_ups(recording: Recording, max_draft: int, host_time: bool = False) -> dict[str, list[float]]:
    """Every figure the report shows, per answer: the methods replayed (draft and auto where the recording has
    the draft's proposals; with host_time, this machine's loop time counted), ngram-simple and the two bounds."""
    out = {
        "lookup": replay_method(recording, "lookup", max_draft, host_time=host_time),
        "ngram-simple": replay_ngram_simple(recording),
        "hindsight bound": hindsight_bound(recording, max_draft),
        "any-copy bound": any_copy_bound(recording, max_draft),
    }
    if recording.has_draft:
        out |= {m: replay_method(recording, m, max_draft, host_time=host_time) for m in ("draft", "auto")}
    return out


def as_json(recording: Recording, figures: dict[str, list[float]]) -> dict:
    """The figures by method and answer, with each method's geometric mean over the answers."""
    return {
        "model": recording.model,
        "draft": recording.draft,
        "temperature": recording.temperature,
        "speed_ups": {m: dict(zip((a.id for a in recording.answers), xs)) for m, xs in figures.items()},
        "geomean": {m: statistics.geometric_mean(xs) for m, xs in figures.items()},
    }


def report(
    recording: Recording, max_draft: int, figures: dict[str, list[float]] | None = None, host_time: bool = False
) -> str:
    f = figures or speed_ups(recording, max_draft, host_time)
    lookup, ngram, bound, any_copy = f["lookup"], f["ngram-simple"], f["hindsight bound"], f["any-copy bound"]
    models = [f[m] for m in ("draft", "auto") if m in f]
    sampled = f", answers sampled at T = {recording.temperature}" if recording.temperature else ""
    drafted = f"; draft {recording.draft} (1 row {1000 * recording.draft_seconds(1):.1f} ms)" if models else ""
    lines = [
        f"{recording.model}{sampled}: decode speed-up over plain decoding on the recorded step costs "
        f"(1 row {1000 * recording.seconds(1):.1f} ms, 16 rows {1000 * recording.seconds(16):.1f} ms)"
        f"{drafted}, max draft {max_draft}"
        f"{'; the methods with this machine’s loop time (--host-time)' if host_time else ''}",
        "| prompt | lookup | ngram-simple | lookup / ngram-simple | hindsight bound | any-copy bound "
        "| any-copy bound / ngram-simple |" + (" draft | auto |" if models else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if models else ""),
    ]
    for i, (a, x, y, z, w) in enumerate(zip(recording.answers, lookup, ngram, bound, any_copy)):
        extra = "".join(f" {m[i]:.2f}x |" for m in models)
        lines.append(f"| {a.id} | {x:.2f}x | {y:.2f}x | {x / y:.2f} | {z:.2f}x | {w:.2f}x | {w / y:.2f} |{extra}")
    med = statistics.median
    extra = "".join(f" {med(m):.2f}x |" for m in models)
    lines.append(
        f"| median | {med(lookup):.2f}x | {med(ngram):.2f}x | {med(x / y for x, y in zip(lookup, ngram)):.2f} "
        f"| {med(bound):.2f}x | {med(any_copy):.2f}x | {med(w / y for w, y in zip(any_copy, ngram)):.2f} |"
        f"{extra}"
    )
    lines.append("geomean: " + ", ".join(f"{m} {statistics.geometric_mean(f[m]):.2f}x" for m in REPLAYED if m in f))
    return "\n".join(lines)


def check(recording: Recording, live: dict, max_draft: int, host_time: bool = False) -> tuple[str, dict]:
    """The replay's prediction set beside live figures of the same answers (bench_compare --out, run greedy with
    --ignore-eos and the recording's --max-tokens): per method, each prompt's median live ratio to plain decoding
    and the prediction, and over the prompts the geometric means and prediction / live."""
    methods = [m for m in REPLAYED if (m == "lookup" or recording.has_draft) and any(m in row for row in live["rows"])]
    figures = {m: replay_method(recording, m, max_draft, host_time=host_time) for m in methods}  # these alone
    ids = [a.id for a in recording.answers]
    lines = [
        "| prompt | " + " | ".join(f"{m} live | {m} replay" for m in methods) + " |",
        "|---|" + "---|---|" * len(methods),
    ]
    measured: dict[str, dict[str, float]] = {m: {} for m in methods}
    for i, name in enumerate(ids):
        cells = []
        for m in methods:
            runs = [row[m] / row["none"] for row in live["rows"] if row["id"] == name and row.get("none")]
            if runs:
                measured[m][name] = statistics.median(runs)
            shown = f"{measured[m][name]:.2f}x" if name in measured[m] else "n/a"
            cells.append(f"{shown} | {figures[m][i]:.2f}x")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    summary = {}
    for m in methods:
        both = [name for name in ids if name in measured[m]]
        if both:
            live_geo = statistics.geometric_mean(measured[m][n] for n in both)
            replay_geo = statistics.geometric_mean(figures[m][ids.index(n)] for n in both)
            summary[m] = {
                "live": live_geo,
                "replay": replay_geo,
                "replay_over_live": replay_geo / live_geo,
                "prompts": len(both),
            }
    lines.append(
        "geomean over prompts: "
        + "; ".join(
            f"{m} live {x['live']:.2f}x, replay {x['replay']:.2f}x (replay / live {x['replay_over_live']:.3f})"
            for m, x in summary.items()
        )
    )
    return "\n".join(lines), summary


def trace(recording: Recording, ids: Sequence[str], max_draft: int) -> str:
    """Every step of the named answers (all when none are named), one line each: where the policy left
    tokens the answer would have kept (offered and keepable, not drafted) is where it can still gain."""
    lines = [
        "| prompt | at | match | continuing | offered | keepable | drafted | accepted | realism |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def show(t: TracedStep) -> None:
        if not ids or t.answer in ids:
            lines.append(
                f"| {t.answer} | {t.position} | {t.match_length} | {'yes' if t.continuing else 'no'} "
                f"| {t.offered} | {t.keepable} | {t.drafted} | {t.accepted} | {t.realism:.2f} |"
            )

    speed_ups = replay_lookup(recording, max_draft, show)
    lines += [f"{a.id}: {x:.2f}x" for a, x in zip(recording.answers, speed_ups) if not ids or a.id in ids]
    return "\n".join(lines)
