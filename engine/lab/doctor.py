"""System check: what SpecChat runs on here, read rather than assumed, and a short measured bench.

python -m engine.doctor [--model PATH|embedded] [--draft PATH|embedded] [--gpu-layers N] [--threads N]
    [--method M] [--json [--progress]] [--no-bench | --no-model] [--rounds N] [--app-pid PID]
(also `specchat doctor`, and Help → System check… in the window)

Reports llama.cpp's version and build (its system info and whether it can offload to a GPU), the ggml devices
with their free/total memory (RAM: what the OS says is available, as llama.cpp's CPU device calls all of it
free), SpecChat's own resident memory apart, torch's device, which VRAM reader works (or "n/a" and why), where a loaded model's
layers really went (read from llama.cpp's own load log) and a bench of plain decoding against prompt lookup
(and the draft model, when one is given) on one code-editing prompt, a fixed number of rounds with each step
announced as "n of m" and the time left estimated from the steps measured so far. It names the usual mistake, an
NVIDIA GPU beside a CPU-only llama.cpp, and prints the command that rebuilds llama-cpp-python for it in this
environment; after a bench, also the window's method (--method) running slower than plain decoding here, and other
processes busy enough on the CPU to make the figures unreliable.
--json prints the whole report as one JSON line (with --progress, one {"progress": ...} line per step before it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .. import hardware
from ..decoding.runtime import LoadSettings, Model
from ..decoding.speculation_config import SpeculationConfig
from ..errors import EngineError
from ..methods import DEFAULT_MAX_DRAFT, DEFAULT_METHOD, DEFAULT_MIN_DRAFT, DEFAULT_P_MIN, METHODS
from ..modelfiles.embedded import resolve_model
from .doctor_bench import BUSY_CPU_PERCENT, DEFAULT_ROUNDS, Progress, Steps, bench, bench_problems
from .doctor_facts import device_facts, problems, system_facts
from .doctor_text import describe

# The pieces of the check live apart (doctor_facts: the system; doctor_bench: the bench; doctor_text: the words);
# the window, the tests and engine.measure take them from here.
__all__ = [
    "BUSY_CPU_PERCENT",
    "CONTEXT",
    "DEFAULT_ROUNDS",
    "bench",
    "check",
    "describe",
    "device_facts",
    "main",
    "problems",
    "system_facts",
]

CONTEXT = 2048  # room for the prompt and the bench's answer


def load_with_placement(spec: str, settings: LoadSettings) -> tuple[Model, dict]:
    model = Model(resolve_model(spec), settings)
    where = {
        key: model.placement.get(key)
        for key in ("layers", "layers_on_gpu", "all_layers_offloaded", "layers_by_device", "weights_bytes_by_buffer")
    }
    if not hardware.gpu_offload_supported():
        where["note"] = "this llama.cpp build has no GPU backend"
    return model, where


def check(
    model: str | None,
    draft: str | None,
    rounds: int | None,
    load: LoadSettings = LoadSettings(n_ctx=CONTEXT),
    method: str = DEFAULT_METHOD,
    app_pid: int | None = None,
    progress: Progress | None = None,
    speculation: SpeculationConfig | None = None,
    p_min: float = DEFAULT_P_MIN,
) -> dict:
    """The whole report. model None: system facts only; rounds None: no bench."""
    report = system_facts(app_pid)
    if model is None:
        return report
    runs = 0 if rounds is None else max(1, rounds) * (4 if draft else 2) + 1  # the runs and the calibration
    steps = Steps(1 + bool(draft) + runs, progress)
    steps.begin("loading the model")
    target, where = load_with_placement(model, load)
    steps.end()
    second = None
    try:
        report["model"] = {
            "path": str(target.path),
            "name": target.name,
            "backend": target.backend,
            "repacked_weights": target.repacked_weights,
            **where,
        }
        if draft:
            steps.begin("loading the draft model")
            second, draft_where = load_with_placement(draft, load)
            steps.end()
            report["draft"] = {
                "path": str(second.path),
                "name": second.name,
                "repacked_weights": second.repacked_weights,
                **draft_where,
            }
        if rounds is not None:
            report["bench"] = bench(target, second, rounds, steps, speculation, p_min)
            report["bench"]["method"] = method
            report["problems"] += bench_problems(report["bench"], method)
        report["memory"] = hardware.read_memory(target.backend).to_dict()
    finally:
        if second is not None:
            second.close()
        target.close()
    report["seconds"] = round(time.perf_counter() - steps.started, 1)
    report["steps"] = steps.log
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.doctor", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded", help="a GGUF path, or 'embedded' (the default)")
    ap.add_argument("--draft", help="a draft GGUF for the model: the bench adds the draft method")
    ap.add_argument("--gpu-layers", type=int, default=-1, help="layers to offload, as in Settings (-1: all)")
    ap.add_argument("--threads", type=int, help="llama.cpp threads (default: physical cores)")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON line")
    ap.add_argument("--no-bench", action="store_true", help="read the system and load the model, no bench")
    ap.add_argument("--no-model", action="store_true", help="read the system only: no model, no bench")
    ap.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help=f"runs of each method in the bench, fastest kept ({DEFAULT_ROUNDS})",
    )
    ap.add_argument(
        "--method",
        choices=METHODS,
        default=DEFAULT_METHOD,
        help=f"the method the chat uses: reported if slower than plain here ({DEFAULT_METHOD})",
    )
    # The bench once took turns for --seconds; scripts that still pass it (packaging/gpu_check.sh) keep working
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT, help="as in Settings: the draft length cap")
    ap.add_argument("--min-draft", type=int, default=DEFAULT_MIN_DRAFT, help="as in Settings: the shortest draft")
    ap.add_argument("--fixed-draft", action="store_true", help="as Settings' adaptive off: always draft max-draft")
    ap.add_argument("--p-min", type=float, default=DEFAULT_P_MIN, help="as in Settings: the draft's cutoff")
    ap.add_argument("--progress", action="store_true", help='with --json: a {"progress": ...} line per step')
    ap.add_argument("--app-pid", type=int, help="the SpecChat window's process: its resident memory is reported")
    return ap.parse_args(argv)


def progress_printer(as_json: bool) -> Progress:
    """Each step as it begins: a JSON line on stdout (the window reads them), or words on stderr."""

    def say(p: dict) -> None:
        if as_json:
            print(json.dumps({"progress": p}), flush=True)
            return
        left = (
            "time left: estimated after the first run"
            if p["left_s"] is None
            else f"about {p['left_s']:.0f} s left (estimate from the runs so far)"
        )
        print(
            f"[{p['step']} of {p['steps']}] {p['doing']}; {p['elapsed_s']:.0f} s so far, {left}",
            file=sys.stderr,
            flush=True,
        )

    return say


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.seconds is not None:
        print("--seconds is no longer read: the bench runs --rounds runs of each method", file=sys.stderr)
    try:
        report = check(
            None if args.no_model else args.model,
            args.draft,
            None if args.no_bench else max(args.rounds, 1),
            LoadSettings(n_ctx=CONTEXT, n_gpu_layers=args.gpu_layers, threads=args.threads),
            args.method,
            args.app_pid,
            progress_printer(True) if args.json and args.progress else None if args.json else progress_printer(False),
            SpeculationConfig(args.max_draft, args.min_draft, not args.fixed_draft),
            args.p_min,
        )
    except (EngineError, OSError) as exc:
        print(
            json.dumps({"error": str(exc)}) if args.json else f"error: {exc}",
            file=sys.stdout if args.json else sys.stderr,
        )
        return 2
    print(json.dumps(report) if args.json else describe(report), flush=True)
    return 0
