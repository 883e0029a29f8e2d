"""A lab run's plot (plot.png): throughput and inter-token latency against concurrency, one line per method, a
row per run, each crossover marked where it falls."""

from __future__ import annotations

import math
from pathlib import Path

from .compare import throughput
from .crossover import METHOD_COLOURS, cell_map, crossover, levels, method_words, methods, threads_words


def _plot_method(ax_rate, ax_itl, results: dict, method: str, marked: int) -> int:
    """One method's lines on both axes, and its crossover marked; the count of crossover labels so far after it."""
    cells, xs = cell_map(results), levels(results)
    colour = METHOD_COLOURS.get(method)
    pts = [(c, cells[(method, c)]) for c in xs if (method, c) in cells]
    conc = [c for c, _ in pts]
    words = method_words(method)
    ax_rate.plot(conc, [throughput(cell) or float("nan") for _, cell in pts], "o-", color=colour, label=words)
    ax_itl.plot(conc, [cell["itl_p50_ms"] or float("nan") for _, cell in pts], "o-", color=colour, label=f"{words} p50")
    ax_itl.plot(
        conc,
        [cell["itl_p95_ms"] or float("nan") for _, cell in pts],
        "s--",
        color=colour,
        alpha=0.6,
        label=f"{words} p95",
    )
    cross = crossover(results, method) if method != "none" else None
    if not cross or cross.stops_at is None:
        return marked
    at = cross.estimate or cross.stops_at
    for ax in (ax_rate, ax_itl):
        ax.axvline(at, color=colour, linestyle=":", alpha=0.8)
    right_half = math.log2(at) > (math.log2(xs[0]) + math.log2(xs[-1])) / 2
    ax_rate.annotate(
        f"{words} stops paying\n≈ {at:.1f}",
        (at, 0.04 + 0.13 * marked),  # each label above the last, as two may fall at one level
        xycoords=("data", "axes fraction"),
        color=colour,
        fontsize=8,
        ha="right" if right_half else "left",
        xytext=(-4 if right_half else 4, 0),
        textcoords="offset points",
    )
    return marked + 1


def _dress(ax_rate, ax_itl, label: str, results: dict) -> None:
    """Both axes' scales, labels, titles and legends."""
    env, xs = results.get("env", {}), levels(results)
    for ax, title, unit in (
        (ax_rate, "decode throughput, every slot busy", "tokens/s"),
        (ax_itl, "inter-token latency", "ms per token"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent sequences")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.set_title(f"{label}: {title} ({env.get('backend', '?')}, {threads_words(env)})", fontsize=10)
        # below the axes: inside, "best" still sat on the crossover labels or the lines
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)


def write_plot(runs: list[tuple[str, dict]], path: str | Path) -> None:
    """Throughput and inter-token latency vs concurrency, one line per method, a row per run."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 5.4 * len(runs)), squeeze=False)
    for (label, results), (ax_rate, ax_itl) in zip(runs, axes):
        marked = 0  # crossover labels so far
        for method in methods(results):
            marked = _plot_method(ax_rate, ax_itl, results, method, marked)
        _dress(ax_rate, ax_itl, label, results)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
