"""The most exact greedy can gain on this machine: the widest verify that decodes every row bit-identically to
one-row steps (exactness.exact_verify_rows) and what steps up to that width cost (calibration.time_steps) bound
it. A step of w rows makes at most w tokens (every draft kept) for cost(w) one-row steps, so no answer in exact
mode beats max over w ≤ width of w / cost(w) plain, whatever proposes; without exact mode the bound runs to the
widest step timed.

    python -m engine.measure.exact_ceiling --model FILE_OR_NAME [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from ..decoding.calibration import time_steps
from ..decoding.exactness import MAX_MEASURED_ROWS, exact_verify_rows
from ..decoding.runtime import LoadSettings, Model
from ..modelfiles.embedded import resolve_model
from ..modelfiles.model_check import check_model_file

WIDTHS = [1, 2, 3, 4, 5, 6, 8, 12, 16]


def ceiling(cost: dict[int, float], width: int) -> tuple[float, int]:
    """(best w / cost(w) over the timed widths up to `width`, that w); cost in one-row steps."""
    return max((w / c, w) for w, c in cost.items() if w <= width)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.measure.exact_ceiling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="the figures as JSON on the last line")
    args = ap.parse_args(argv)
    path = resolve_model(args.model)
    check_model_file(path)  # loaded in this process below, where a damaged file would abort it
    model = Model(path, LoadSettings(n_ctx=512, threads=args.threads))
    try:
        tokens = model.tokenize("def add(a, b):\n    return a + b\n")
        width = exact_verify_rows(model, 0, 0, tokens)
        seconds = time_steps(model, 0, 0, tokens[0], WIDTHS)
    finally:
        model.close()
    cost = {w: s / seconds[1] for w, s in seconds.items()}
    exact, exact_w = ceiling(cost, width)
    free, free_w = ceiling(cost, max(WIDTHS))
    print(f"{path.name}, {args.threads} threads: one-row step {seconds[1] * 1000:.1f} ms")
    print("step cost in one-row steps: " + ", ".join(f"{w} rows {c:.2f}" for w, c in cost.items()))
    print(f"widest verify identical to one-row decodes: {width} rows (measured up to {MAX_MEASURED_ROWS})")
    print(
        f"at most {exact:.2f}x plain with exact greedy ({exact_w} rows, every draft kept); "
        f"{free:.2f}x without ({free_w} rows)"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "model": path.name,
                    "threads": args.threads,
                    "one_row_s": seconds[1],
                    "cost": cost,
                    "exact_rows": width,
                    "exact_ceiling": exact,
                    "ceiling": free,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
