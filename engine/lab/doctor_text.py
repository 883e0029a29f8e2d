"""The system check's report as lines a person reads."""

from __future__ import annotations

from pathlib import Path

from .doctor_bench import BENCH_NAMES


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
    lines = _system_lines(report) + _model_lines(report)
    if "bench" in report:
        lines += _bench_lines(report["bench"])
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


def _system_lines(report: dict) -> list[str]:
    """llama.cpp's build, the devices, the RAM, torch, the NVIDIA GPUs and the VRAM reader."""
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
    return lines


def _model_lines(report: dict) -> list[str]:
    """Where the models' layers went, and the memory of the check with the model loaded."""
    lines = []
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
    return lines


def _bench_lines(b: dict) -> list[str]:
    """The bench: how it ran, then a line per method."""
    cpu = b["cpu"]
    busy = "n/a" if cpu["others_percent"] is None else f"{cpu['others_percent']:g}%"
    lines = [
        f"bench: {b['prompt']}, {b['tokens']} tokens greedy, fastest of {b['rounds']} run{'s' * (b['rounds'] != 1)} of each "
        f"method, {b['seconds']} s of runs (measured here, now); other processes' CPU use meanwhile "
        f"{busy} of {cpu['cores']} cores:"
    ]
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
    return lines
