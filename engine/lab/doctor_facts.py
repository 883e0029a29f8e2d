"""What the system check reads without loading a model: llama.cpp's build and devices, the RAM and SpecChat's own
share of it, torch's device, the VRAM reader; and the mistakes it can name from them, each with what to do."""

from __future__ import annotations

import os
import platform
import sys

import llama_cpp
import psutil
import torch

from .. import hardware
from ..decoding.sampling import pick_device


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
