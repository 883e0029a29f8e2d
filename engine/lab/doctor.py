"""System check: what SpecChat runs on here, read rather than assumed, and a short measured bench.

python -m engine.doctor [--model PATH|embedded] [--draft PATH|embedded] [--gpu-layers N] [--threads N]
    [--json] [--no-bench | --no-model] [--seconds S]
(also `specchat doctor`, and Help → System check… in the window)

Reports llama.cpp's version and build (its system info and whether it can offload to a GPU), the ggml devices
with their free/total memory, torch's device, which VRAM reader works (or "n/a" and why), where a loaded model's
layers really went (read from llama.cpp's own load log) and a bench of plain decoding against prompt lookup
(and the draft model, when one is given) on one code-editing prompt. It names the usual mistake, an NVIDIA GPU
beside a CPU-only llama.cpp, and prints the command that rebuilds llama-cpp-python for it in this environment.
--json prints the whole report as one JSON line.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import llama_cpp
import torch

from .. import hardware
from ..chat_format import ChatFormatter
from ..decoding.generate import SpeculativeDecoder
from ..decoding.loader import proposer_for
from ..decoding.proposers.base import NoProposer
from ..decoding.runtime import LoadSettings, Model
from ..decoding.sampling import SamplingParams, pick_device
from ..errors import EngineError
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
DEFAULT_SECONDS = 15.0
CONTEXT = 2048  # room for the prompt and the bench's answer
def rebuild_command(flag: str) -> str:
    """The command that rebuilds this environment's llama-cpp-python (same version) with a GPU backend."""
    return (f'CMAKE_ARGS="{flag}" {sys.executable} -m pip install --force-reinstall --no-cache-dir --no-deps '
            f"llama-cpp-python=={llama_cpp.__version__}")


def device_facts() -> list[dict]:
    """llama.cpp's devices and what each says of its memory now."""
    facts = []
    for dev in hardware.devices():
        memory = hardware.device_memory(dev)
        facts.append({"name": dev.name, "description": dev.description, "gpu": dev.is_gpu,
                      "software": hardware.is_software_device(dev),
                      "free_bytes": memory[0] if memory else None, "total_bytes": memory[1] if memory else None})
    return facts


def system_facts() -> dict:
    """Everything the check reads without loading a model."""
    devices = device_facts()
    nvidia, seen_by = hardware.nvidia_gpus()
    offload = hardware.gpu_offload_supported()
    backend = hardware.backend_name()
    reader, why = hardware.vram_reader(backend)
    facts = {
        "python": platform.python_version(), "machine": platform.machine(), "system": platform.system(),
        "llama_cpp": {"version": llama_cpp.__version__, "gpu_offload": offload, "backend": backend,
                      "system_info": (llama_cpp.llama_print_system_info() or b"").decode(errors="replace").strip()},
        "devices": devices,
        "torch": {"version": torch.__version__, "device": str(pick_device()), "cuda": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available()},
        "nvidia_gpus": nvidia, "nvidia_seen_by": seen_by,
        "vram_reader": {"source": reader, "why": why},
        "problems": [],
    }
    facts["problems"] = problems(facts)
    return facts


def problems(facts: dict) -> list[dict]:
    """The mistakes this check can name, each with what to do."""
    found = []
    for dev in (d for d in facts["devices"] if d.get("software")):
        found.append({
            "problem": f"{dev['name']} is {dev['description']}, a software {facts['llama_cpp']['backend']} device: it "
                       "runs on the CPU, slower than llama.cpp's own CPU backend. For testing the GPU path only.",
            "fix": "unset GGML_VK_VISIBLE_DEVICES (llama.cpp then skips CPU-type devices), or set GPU layers to 0",
        })
    if facts["nvidia_gpus"] and not facts["llama_cpp"]["gpu_offload"]:
        found.append({
            "problem": f"An NVIDIA GPU is here ({', '.join(facts['nvidia_gpus'])}), but this llama.cpp build is "
                       "CPU-only, so models run on the CPU.",
            "fix": rebuild_command("-DGGML_CUDA=on") + "   (needs the CUDA toolkit's nvcc; then restart SpecChat)",
        })
    if facts["nvidia_gpus"] and facts["llama_cpp"]["gpu_offload"] and \
            facts["vram_reader"]["source"] != hardware.NVML_SOURCE:
        found.append({"problem": "VRAM shows what llama.cpp allocated, not the driver's figure for SpecChat (which "
                                 "adds the CUDA context).",
                      "fix": f"{sys.executable} -m pip install nvidia-ml-py"})
    if facts["nvidia_gpus"] and not facts["torch"]["cuda_available"]:
        found.append({"problem": "torch is a CPU build: the sampling math runs on the CPU (correct, a little "
                                 "slower per step on large vocabularies).",
                      "fix": f"{sys.executable} -m pip install torch "
                             "--index-url https://download.pytorch.org/whl/cu128"})
    return found


def bench(target: Model, draft: Model | None, seconds: float) -> dict:
    """Plain decoding against prompt lookup (and the draft model, and both as auto) on BENCH_PROMPT, greedy, BENCH_TOKENS tokens
    each, taking turns until `seconds` have passed (at least one round); each method's fastest run is kept, as
    other work on the machine only ever slows a run down."""
    _, prompt, _ = ChatFormatter(target).render([{"role": "user", "content": BENCH_PROMPT}])  # as the chat sends it
    names = {"plain": "none", "lookup": "lookup", **({"draft": "draft", "auto": "auto"} if draft is not None else {})}
    methods = {name: proposer_for(method, target, draft, remember_requests=False) for name, method in names.items()}
    decoder = SpeculativeDecoder(target, NoProposer())
    decoder.calibrate()  # timed once per model file and kept (step_timings): the planner's costs are measured
    started, runs = time.perf_counter(), {name: [] for name in methods}
    while not runs["plain"] or time.perf_counter() - started < seconds:
        for name, proposer in methods.items():
            decoder.set_speculation(proposer, decoder.speculation)  # a planner of its kind; the step costs kept
            decoder.forget()  # each run prefills the prompt afresh, so none starts ahead
            for _ in decoder.generate(prompt, SamplingParams(temperature=0.0), max_tokens=BENCH_TOKENS,
                                      ignore_eos=True):
                pass
            s = decoder.stats
            runs[name].append({"tokens_per_s": s.decode_tokens_per_s, "acceptance_rate": s.acceptance_rate,
                               "mean_acceptance_length": s.mean_acceptance_length, "ttft_s": s.ttft_s})
    best = {name: max(found, key=lambda r: r["tokens_per_s"] or 0.0) | {"runs": len(found)}
            for name, found in runs.items()}
    plain = best["plain"]["tokens_per_s"]
    for name, run in best.items():
        run["vs_plain"] = round(run["tokens_per_s"] / plain, 3) if plain and run["tokens_per_s"] else None
    return {"prompt": "a code edit (rename a variable in a 10-line function)", "prompt_tokens": len(prompt),
            "tokens": BENCH_TOKENS, "seconds": round(time.perf_counter() - started, 1), "methods": best}


def load_with_placement(spec: str, settings: LoadSettings) -> tuple[Model, dict]:
    model = Model(resolve_model(spec), settings)
    where = {key: model.placement.get(key) for key in ("layers", "layers_on_gpu", "all_layers_offloaded",
                                                        "layers_by_device", "weights_bytes_by_buffer")}
    if not hardware.gpu_offload_supported():
        where["note"] = "this llama.cpp build has no GPU backend"
    return model, where


def check(model: str | None, draft: str | None, seconds: float | None,
          load: LoadSettings = LoadSettings(n_ctx=CONTEXT)) -> dict:
    """The whole report. model None: system facts only."""
    report = system_facts()
    if model is None:
        return report
    target, where = load_with_placement(model, load)
    second = None
    try:
        report["model"] = {"path": str(target.path), "name": target.name, "backend": target.backend,
                           "repacked_weights": target.repacked_weights, **where}
        if draft:
            second, draft_where = load_with_placement(draft, load)
            report["draft"] = {"path": str(second.path), "name": second.name,
                               "repacked_weights": second.repacked_weights, **draft_where}
        if seconds is not None:
            report["bench"] = bench(target, second, seconds)
        report["memory"] = hardware.read_memory(target.backend).to_dict()
    finally:
        if second is not None:
            second.close()
        target.close()
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
    lines = [f"llama.cpp (llama-cpp-python {ll['version']}): backend {ll['backend']}, GPU offload "
             f"{'supported' if ll['gpu_offload'] else 'not supported by this build'}",
             f"  system info: {ll['system_info']}", "devices:"]
    lines += [f"  {d['name']} ({d['description']}): {'GPU' if d['gpu'] else 'CPU'}"
              + (" (software: runs on the CPU, slow, for testing)" if d.get("software") else "")
              + f", free {_gib(d['free_bytes'])} of {_gib(d['total_bytes'])}" for d in report["devices"]] \
        or ["  none listed"]
    lines.append(f"torch {tt['version']}: sampling on {tt['device']}" + (f" (CUDA {tt['cuda']})" if tt["cuda"] else ""))
    lines.append(f"NVIDIA GPUs: {', '.join(report['nvidia_gpus']) or 'none'} ({report['nvidia_seen_by']})")
    vr = report["vram_reader"]
    lines.append(f"VRAM reader: {vr['source'] or 'n/a'}: {vr['why']}")
    for key in ("model", "draft"):
        if key in report:
            m = report[key]
            on_gpu = "n/a" if m["layers_on_gpu"] is None else f"{m['layers_on_gpu']}/{m['layers']}"
            lines.append(f"{key}: {Path(m['path']).name} ({m['name']}): layers on the GPU {on_gpu}"
                         + (f" ({m['note']})" if "note" in m else "") + _repacked_words(m["repacked_weights"]))
    if "memory" in report:
        lines.append(f"memory: {report['memory']['kind']} {_gib(report['memory']['bytes'])} "
                     f"({report['memory']['source']})")
    if "bench" in report:
        b = report["bench"]
        lines.append(f"bench: {b['prompt']}, {b['tokens']} tokens greedy, fastest of each method over "
                     f"{b['seconds']} s (measured here, now):")
        for name, run in b["methods"].items():
            extra = "" if run["acceptance_rate"] is None else (
                f", acceptance {run['acceptance_rate']:.0%}, {run['mean_acceptance_length']:.2f} tokens per step")
            lines.append(f"  {name:7s} {run['tokens_per_s'] or 0:6.1f} tok/s ({run['vs_plain']}x plain){extra}")
    for found in report["problems"]:
        lines += [f"PROBLEM: {found['problem']}", f"  fix: {found['fix']}"]
    if not report["problems"]:
        lines.append("No problems found.")
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
    ap.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="how long the bench takes turns (15)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = check(None if args.no_model else args.model, args.draft,
                       None if args.no_bench else max(args.seconds, 0.0),
                       LoadSettings(n_ctx=CONTEXT, n_gpu_layers=args.gpu_layers, threads=args.threads))
    except (EngineError, OSError) as exc:
        print(json.dumps({"error": str(exc)}) if args.json else f"error: {exc}", file=sys.stdout if args.json
              else sys.stderr)
        return 2
    print(json.dumps(report) if args.json else describe(report), flush=True)
    return 0
