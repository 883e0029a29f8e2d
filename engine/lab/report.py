"""Reading a lab run: speed-ups against plain decoding, the crossover concurrency, advice in plain
words, the markdown summary and the plot. Pure functions of the results document, so the window,
the CLI and a saved file all give the same answer. The pieces live apart (crossover.py: the cells and where
speculation stops paying; advice.py: the verdict and the settings it means; summary.py: summary.md; plot.py:
plot.png); this module is where the window and the command take them from.

python -m engine.lab.report DIR [DIR ...] --out PLOT.png   (one plot of several runs, a row each)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .advice import advise, best_draft_length, with_analysis
from .compare import throughput
from .crossover import METHOD_COLOURS, METHOD_WORDS, crossover, method_words
from .plot import write_plot
from .summary import memory_text, summary_markdown, utilisation_text

__all__ = [
    "METHOD_COLOURS",
    "METHOD_WORDS",
    "advise",
    "best_draft_length",
    "crossover",
    "memory_text",
    "method_words",
    "summary_markdown",
    "throughput",
    "utilisation_text",
    "with_analysis",
    "write_plot",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.lab.report", description="Plot several lab runs together.")
    ap.add_argument("dirs", nargs="+", help="folders written by python -m engine.lab")
    ap.add_argument("--out", required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    runs = []
    for d in args.dirs:
        results = json.loads((Path(d) / "results.json").read_text(encoding="utf-8"))
        runs.append((results["settings"].get("prompt_set", Path(d).name), results))
    write_plot(runs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
