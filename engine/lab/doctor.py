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
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import psutil
import torch

from .. import hardware
from ..chat_format import ChatFormatter
from ..decoding.cost_model import SpeculationConfig
from ..decoding.generate import SpeculativeDecoder
from ..decoding.proposers.base import NoProposer
from ..decoding.proposers.registry import proposer_for
from ..decoding.runtime import LoadSettings, Model
from ..decoding.sampling import SamplingParams, pick_device
from ..errors import EngineError
from ..methods import DEFAULT_MAX_DRAFT, DEFAULT_METHOD, DEFAULT_MIN_DRAFT, DEFAULT_P_MIN, METHODS, REGISTRY
from ..modelfiles.embedded import resolve_model

# A code edit: the answer copies most of its prompt, as the edits people ask of a chat do.
BENCH_PROMPT = """Rename the variable `total` to `running_sum` in this function and change nothing else:

```python
def summarize(orders):
    total = 0
    for order in orders:
        if order.paid:
            total += order.amount
        else:
            print("unpaid order", order.id, "skipped")
    print("orders:", len(orders), "total:", total)
    return total
```"""
BENCH_TOKENS = 96
# Each method runs this many times, in turns, and its fastest run is kept: a fixed count, so the steps can be
# counted ("n of m") and the time left estimated from the runs already timed, whatever the machine's speed.
DEFAULT_ROUNDS = 2
CONTEXT = 2048  # room for the prompt and the bench's answer
# Other processes taking more than this share of the machine's CPU time while the bench runs make its figures
# unreliable (one busy process here cut llama.cpp from ~72 to ~24 tok/s, DESIGN.md): named as a problem.
BUSY_CPU_PERCENT = 25.0
# The window's method is reported when its fastest run is slower than plain decoding's fastest (ratio below 1).
SLOWER_THAN_PLAIN = 1.0
BENCH_NAMES = {"none": "plain", "lookup": "lookup", "draft": "draft", "auto": "auto"}  # method key -> bench row

Progress = Callable[[dict], None]


def rebuild_command(flag: str) -> str:
    """The command that rebuilds this environment's llama-cpp-python (same version) with a GPU backend."""
    return (
        f'CMAKE_ARGS="{flag}" {sys.executable} -m pip install --force-reinstall --no-cache-dir --no-deps '
        f"llama-cpp-python=={llama_cpp.__version__}"
    )


def device_facts(ram=None) -> list[dict]:
    """llama.cpp's devices and what each says of its memory now. A CPU device's memory is the OS's reading:
    llama.cpp's CPU backend reports its total as free on Linux and macOS ("assume that all of it is free",
    ggml-cpu.cpp), which showed "free 23.54 GiB of 23.54 GiB" while SpecChat held 3 GB."""
    facts, ram = [], ram or psutil.virtual_memory()  # one reading for the device and the RAM line
    for dev in hardware.devices():
        if dev.is_gpu:
            memory, source = hardware.device_memory(dev), f"llama.cpp's {dev.name} device"
        else:
            memory, source = (ram.available, ram.total), "the OS's available RAM (psutil)"
        facts.append(
            {
                "name": dev.name,
                "description": dev.description,
                "gpu": dev.is_gpu,
                "software": hardware.is_software_device(dev),
                "free_bytes": memory[0] if memory else None,
                "total_bytes": memory[1] if memory else None,
                "memory_source": source if memory else None,
            }
        )
    return facts


def ram_facts(app_pid: int | None, ram=None) -> dict:
    """The machine's RAM (available, not merely unused, of total) and SpecChat's own resident memory apart: the
    window's when run from it (app_pid), else this process's. None where it cannot be read."""
    ram = ram or psutil.virtual_memory()
    pid = app_pid or os.getpid()
    try:
        rss = psutil.Process(pid).memory_info().rss
    except (psutil.Error, OSError):
        rss = None
    who = "the SpecChat window" if app_pid else "this check"
    return {
        "available_bytes": ram.available,
        "total_bytes": ram.total,
        "source": "psutil.virtual_memory",
        "specchat": {"pid": pid, "who": who, "resident_bytes": rss},
    }


def system_facts(app_pid: int | None = None) -> dict:
    """Everything the check reads without loading a model."""
    ram = psutil.virtual_memory()
    devices = device_facts(ram)
    nvidia, seen_by = hardware.nvidia_gpus()
    offload = hardware.gpu_offload_supported()
    backend = hardware.backend_name()
    reader, why = hardware.vram_reader(backend)
    facts = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "system": platform.system(),
        "llama_cpp": {
            "version": llama_cpp.__version__,
            "gpu_offload": offload,
            "backend": backend,
            "system_info": (llama_cpp.llama_print_system_info() or b"").decode(errors="replace").strip(),
        },
        "devices": devices,
        "ram": ram_facts(app_pid, ram),
        "torch": {
            "version": torch.__version__,
            "device": str(pick_device()),
            "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(),
        },
        "nvidia_gpus": nvidia,
        "nvidia_seen_by": seen_by,
        "vram_reader": {"source": reader, "why": why},
        "problems": [],
    }
    facts["problems"] = problems(facts)
    return facts


def problems(facts: dict) -> list[dict]:
    """The mistakes this check can name, each with what to do."""
    found = []
    for dev in (d for d in facts["devices"] if d.get("software")):
        found.append(
            {
                "problem": f"{dev['name']} is {dev['description']}, a software {facts['llama_cpp']['backend']} device: it "
                "runs on the CPU, slower than llama.cpp's own CPU backend. For testing the GPU path only.",
                "fix": "unset GGML_VK_VISIBLE_DEVICES (llama.cpp then skips CPU-type devices), or set GPU layers to 0",
            }
        )
    if facts["nvidia_gpus"] and not facts["llama_cpp"]["gpu_offload"]:
        found.append(
            {
                "problem": f"An NVIDIA GPU is here ({', '.join(facts['nvidia_gpus'])}), but this llama.cpp build is "
                "CPU-only, so models run on the CPU.",
                "fix": rebuild_command("-DGGML_CUDA=on") + "   (needs the CUDA toolkit's nvcc; then restart SpecChat)",
            }
        )
    if (
        facts["nvidia_gpus"]
        and facts["llama_cpp"]["gpu_offload"]
        and facts["vram_reader"]["source"] != hardware.NVML_SOURCE
    ):
        found.append(
            {
                "problem": "VRAM shows what llama.cpp allocated, not the driver's figure for SpecChat (which "
                "adds the CUDA context).",
                "fix": f"{sys.executable} -m pip install nvidia-ml-py",
            }
        )
    if facts["nvidia_gpus"] and not facts["torch"]["cuda_available"]:
        found.append(
            {
                "problem": "torch is a CPU build: the sampling math runs on the CPU (correct, a little "
                "slower per step on large vocabularies).",
                "fix": f"{sys.executable} -m pip install torch --index-url https://download.pytorch.org/whl/cu128",
            }
        )
    return found


class Steps:
    """The check's steps, counted ("n of m"), each announced to `progress` with the time left estimated from the
    runs already timed: a method's own runs when it has some, else the mean of every run so far. Before any run
    is timed there is no estimate (None), and loading or calibrating is never extrapolated from."""

    def __init__(self, total: int, progress: Progress | None):
        self.total, self.done, self.progress = total, 0, progress
        self.started = time.perf_counter()
        self.runs: dict[str, list[float]] = {}  # method -> seconds of each timed run
        self.pending: list[str] = []  # the methods of the runs still to come, in order
        self.log: list[dict] = []  # each step done: what it measured and how long it took
        self._begun = (self.started, "")

    def left_s(self) -> float | None:
        timed = [t for ts in self.runs.values() for t in ts]
        if not timed or self.done < self.total - len(self.pending):
            return None
        mean = sum(timed) / len(timed)
        return sum(sum(self.runs[m]) / len(self.runs[m]) if self.runs.get(m) else mean for m in self.pending)

    def begin(self, doing: str) -> None:
        self._begun = (time.perf_counter(), doing)
        if self.progress is not None:
            left = self.left_s()
            self.progress(
                {
                    "step": self.done + 1,
                    "steps": self.total,
                    "doing": doing,
                    "elapsed_s": round(time.perf_counter() - self.started, 1),
                    "left_s": None if left is None else round(left, 1),
                    "left_is_estimate": True,
                }
            )

    def end(self, method: str | None = None, seconds: float | None = None) -> None:
        self.done += 1
        t, doing = self._begun
        self.log.append(
            {"step": self.done, "steps": self.total, "doing": doing, "seconds": round(time.perf_counter() - t, 1)}
        )
        if method is not None:
            self.runs.setdefault(method, []).append(seconds)
            self.pending.pop(0)


class CpuWatch:
    """The share of the machine's CPU time other processes took between start() and stop(): the system's busy
    time (psutil.cpu_times) less this process's own (every thread of it, llama.cpp's included)."""

    def start(self) -> None:
        self.t0, self.sys0, self.own0 = time.perf_counter(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    @staticmethod
    def _own() -> float:
        t = psutil.Process().cpu_times()
        return t.user + t.system

    def stop(self) -> dict:
        wall, cores = time.perf_counter() - self.t0, psutil.cpu_count() or 1
        others = max(0.0, (self._busy() - self.sys0) - (self._own() - self.own0))
        percent = round(100 * others / (wall * cores), 1) if wall > 0 else None
        return {
            "others_percent": percent,
            "cores": cores,
            "threshold_percent": BUSY_CPU_PERCENT,
            "source": "psutil: the system's CPU time less this process's, during the runs",
        }


def bench(
    target: Model,
    draft: Model | None,
    rounds: int = DEFAULT_ROUNDS,
    steps: Steps | None = None,
    speculation: SpeculationConfig | None = None,
    p_min: float = DEFAULT_P_MIN,
) -> dict:
    """Plain decoding against prompt lookup (and the draft model, and both as auto) on BENCH_PROMPT, greedy,
    BENCH_TOKENS tokens each, `rounds` runs of each method taken in turns; each method's fastest run is kept, as
    other work on the machine only ever slows a run down. `steps` counts the calibration and each run;
    `speculation` and `p_min` are the chat's settings (draft lengths, the planner on or off), so each method runs
    as the chat would run it."""
    _, prompt, _ = ChatFormatter(target).render([{"role": "user", "content": BENCH_PROMPT}])  # as the chat sends it
    names = {"plain": "none", "lookup": "lookup", **({"draft": "draft", "auto": "auto"} if draft is not None else {})}
    methods = {
        name: proposer_for(method, target, draft, p_min, remember_requests=False) for name, method in names.items()
    }
    rounds = max(1, rounds)
    steps = steps or Steps(1 + rounds * len(methods), None)
    steps.pending += [name for _ in range(rounds) for name in methods]
    decoder = SpeculativeDecoder(target, NoProposer(), speculation or SpeculationConfig())
    steps.begin("timing each step size once (calibration)")
    decoder.calibrate()  # timed once per model file and kept (step_timings): the planner's costs are measured
    steps.end()
    started, runs, cpu = time.perf_counter(), {name: [] for name in methods}, CpuWatch()
    cpu.start()
    for r in range(rounds):
        for name, proposer in methods.items():
            steps.begin(f"{REGISTRY[names[name]].prose}, run {r + 1} of {rounds}")
            t = time.perf_counter()
            decoder.set_speculation(proposer, decoder.speculation)  # a planner of its kind; the step costs kept
            decoder.forget()  # each run prefills the prompt afresh, so none starts ahead
            for _ in decoder.generate(
                prompt, SamplingParams(temperature=0.0), max_tokens=BENCH_TOKENS, ignore_eos=True
            ):
                pass
            s = decoder.stats
            runs[name].append(
                {
                    "tokens_per_s": s.decode_tokens_per_s,
                    "acceptance_rate": s.acceptance_rate,
                    "mean_acceptance_length": s.mean_acceptance_length,
                    "ttft_s": s.ttft_s,
                }
            )
            steps.end(name, time.perf_counter() - t)
    best = {
        name: max(found, key=lambda r: r["tokens_per_s"] or 0.0) | {"runs": len(found)} for name, found in runs.items()
    }
    plain = best["plain"]["tokens_per_s"]
    for run in best.values():
        run["vs_plain"] = round(run["tokens_per_s"] / plain, 3) if plain and run["tokens_per_s"] else None
    return {
        "prompt": "a code edit (rename a variable in a 10-line function)",
        "prompt_tokens": len(prompt),
        "tokens": BENCH_TOKENS,
        "rounds": rounds,
        "seconds": round(time.perf_counter() - started, 1),
        "cpu": cpu.stop(),
        "methods": best,
    }


def bench_problems(b: dict, method: str) -> list[dict]:
    """After a bench: the window's method slower than plain decoding here, and a CPU too busy to trust."""
    found = []
    others = b["cpu"]["others_percent"]
    busy = others is not None and others > BUSY_CPU_PERCENT
    run = b["methods"].get(BENCH_NAMES.get(method, ""))
    if method != "none" and run is not None and run["vs_plain"] is not None and run["vs_plain"] < SLOWER_THAN_PLAIN:
        faster = [
            (r["vs_plain"], n)
            for n, r in b["methods"].items()
            if n != "plain" and r["vs_plain"] is not None and r["vs_plain"] > 1.0
        ]
        keys = {row: key for key, row in BENCH_NAMES.items()}
        choice = (
            f"choose {REGISTRY[keys[max(faster)[1]]].label} ({max(faster)[0]:g}× plain in the same bench)"
            if faster
            else "turn speculation off (plain decoding was the fastest here)"
        )
        runs = f"{run['runs']} run{'s' * (run['runs'] != 1)}"
        found.append(
            {
                "problem": f"{method} ran at {run['vs_plain']:g}× plain decoding on this machine (fastest of "
                f"{runs} each, measured just now): it slows answers down here.",
                "fix": ("measure again once the CPU is quiet (below); if it stays slower, " if busy else "")
                + f"Settings → Speculation: {choice}",
            }
        )
    if busy:
        found.append(
            {
                "problem": f"Other processes used {others:g}% of the CPU ({b['cpu']['cores']} cores) while the "
                f"speed was measured, above {BUSY_CPU_PERCENT:g}%: the figures above are not "
                "reliable.",
                "fix": "close or wait for the busy programs, then measure again",
            }
        )
    return found


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


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def _repacked_words(repacked: int) -> str:
    """runtime.model_params' count: -1 llama.cpp chose (no AMX), 0 none, N repacked by SpecChat (AMX CPUs)."""
    if repacked < 0:
        return ""
    if repacked == 0:
        return "; no weights repacked for the CPU kernels (AMX kernels off)"
    return f"; {repacked} weight matrices repacked for the CPU kernels (AMX kernels off)"


def describe(report: dict) -> str:
    """The report as lines a person reads."""
    ll, tt = report["llama_cpp"], report["torch"]
    lines = [
        f"llama.cpp (llama-cpp-python {ll['version']}): backend {ll['backend']}, GPU offload "
        f"{'supported' if ll['gpu_offload'] else 'not supported by this build'}",
        f"  system info: {ll['system_info']}",
        "devices:",
    ]
    lines += [
        f"  {d['name']} ({d['description']}): {'GPU' if d['gpu'] else 'CPU'}"
        + (" (software: runs on the CPU, slow, for testing)" if d.get("software") else "")
        + f", free {_gib(d['free_bytes'])} of {_gib(d['total_bytes'])}"
        + (f" ({d['memory_source']})" if d.get("memory_source") else "")
        for d in report["devices"]
    ] or ["  none listed"]
    if "ram" in report:
        ram, own = report["ram"], report["ram"]["specchat"]
        lines.append(
            f"RAM: available {_gib(ram['available_bytes'])} of {_gib(ram['total_bytes'])}; SpecChat's own "
            f"resident memory ({own['who']}, pid {own['pid']}): {_gib(own['resident_bytes'])}"
        )
    lines.append(f"torch {tt['version']}: sampling on {tt['device']}" + (f" (CUDA {tt['cuda']})" if tt["cuda"] else ""))
    lines.append(f"NVIDIA GPUs: {', '.join(report['nvidia_gpus']) or 'none'} ({report['nvidia_seen_by']})")
    vr = report["vram_reader"]
    lines.append(f"VRAM reader: {vr['source'] or 'n/a'}: {vr['why']}")
    for key in ("model", "draft"):
        if key in report:
            m = report[key]
            on_gpu = "n/a" if m["layers_on_gpu"] is None else f"{m['layers_on_gpu']}/{m['layers']}"
            lines.append(
                f"{key}: {Path(m['path']).name} ({m['name']}): layers on the GPU {on_gpu}"
                + (f" ({m['note']})" if "note" in m else "")
                + _repacked_words(m["repacked_weights"])
            )
    if "memory" in report:
        lines.append(
            f"memory of this check, the model loaded a second time: {report['memory']['kind']} "
            f"{_gib(report['memory']['bytes'])} ({report['memory']['source']})"
        )
    if "bench" in report:
        b = report["bench"]
        cpu = b["cpu"]
        busy = "n/a" if cpu["others_percent"] is None else f"{cpu['others_percent']:g}%"
        lines.append(
            f"bench: {b['prompt']}, {b['tokens']} tokens greedy, fastest of {b['rounds']} run{'s' * (b['rounds'] != 1)} of each "
            f"method, {b['seconds']} s of runs (measured here, now); other processes' CPU use meanwhile "
            f"{busy} of {cpu['cores']} cores:"
        )
        for name, run in b["methods"].items():
            extra = (
                ""
                if run["acceptance_rate"] is None
                else (f", acceptance {run['acceptance_rate']:.0%}, {run['mean_acceptance_length']:.2f} tokens per step")
            )
            mine = "   <- the window's method" if BENCH_NAMES.get(b.get("method", "")) == name else ""
            speed = "n/a" if run["tokens_per_s"] is None else f"{run['tokens_per_s']:6.1f} tok/s"
            ratio = "n/a" if run["vs_plain"] is None else f"{run['vs_plain']:g}×"
            lines.append(f"  {name:7s} {speed} ({ratio} plain){extra}{mine}")
    for found in report["problems"]:
        lines += [f"PROBLEM: {found['problem']}", f"  fix: {found['fix']}"]
    if not report["problems"]:
        lines.append("No problems found.")
    if "seconds" in report:
        lines.append(
            f"The check took {report['seconds']} s (measured): "
            + "; ".join(f"{s['step']} of {s['steps']} {s['doing']} {s['seconds']:g} s" for s in report.get("steps", []))
        )
    return "\n".join(lines)


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
