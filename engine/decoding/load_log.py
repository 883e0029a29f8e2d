"""What llama.cpp says while it loads a model: where each layer went and what it allocated where.

Read from its own log rather than assumed from the settings: a GPU build may keep layers on the CPU (too little
VRAM, an operation the backend lacks), and the log is the one place that says so for every backend alike.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import llama_cpp

_LAYER = re.compile(r"load_tensors: layer +\d+ assigned to device (\S+?),")
_OFFLOADED = re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU")
# "load_tensors:      Vulkan0 model buffer size =   123.45 MiB", and the KV cache's, the compute graph's, ...
_BUFFER = re.compile(r"(\w+): +(\S+) +(model|KV|RS|compute|output) buffer size = +([\d.]+) MiB")
_MIB = 2**20


@contextmanager
def llama_log() -> Iterator[list[str]]:
    """llama.cpp's log lines while the block runs (debug level included), then llama-cpp-python's logger again.
    Not nestable (the callback is global): loads take runtime's lifecycle lock, so two never overlap."""
    from llama_cpp import _logger

    lines: list[str] = []
    echo = bool(os.environ.get("SPECCHAT_LLAMA_VERBOSE"))  # the chatter the user asked to see, still shown

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]  # a ctypes CFUNCTYPE: untyped
    def keep(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace")
        lines.append(line)
        if echo:
            print(line, end="", file=sys.stderr, flush=True)

    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def on_device(buffer: str, gpu_names: Iterable[str]) -> str | None:
    """The GPU device a buffer lives on ("Vulkan0", "CUDA0"), None for host memory ("CPU_Mapped",
    "CUDA_Host", "Vulkan_Host")."""
    if buffer.endswith("_Host"):
        return None
    return next((name for name in gpu_names if buffer == name or buffer.startswith(name + "_")), None)


def placement(log_text: str, gpu_names: Iterable[str] = ()) -> dict[str, Any]:
    """Where llama.cpp put a model's layers (the output layer counted as one) and what it allocated on each GPU
    device (weights, KV cache, compute buffers), from its load log. None where the log said nothing."""
    gpu_names = tuple(gpu_names)
    layers = Counter(_LAYER.findall(log_text))
    on_gpu = sum(n for device, n in layers.items() if not device.upper().startswith("CPU"))
    offloaded = _OFFLOADED.search(log_text)
    total: int | None
    if offloaded:  # llama.cpp's own count, where it gives one (GPU builds)
        on_gpu, total = int(offloaded[1]), int(offloaded[2])
    else:
        total = sum(layers.values()) or None
    buffers: list[dict[str, Any]] = []
    device_bytes: Counter[str] = Counter()
    for _, name, kind, mib in _BUFFER.findall(log_text):
        size = round(float(mib) * _MIB)
        buffers.append({"buffer": name, "kind": kind, "bytes": size})
        device = on_device(name, gpu_names)
        if device:
            device_bytes[device] += size
    return {
        "layers": total,
        "layers_on_gpu": on_gpu if (layers or offloaded) else None,
        "all_layers_offloaded": (on_gpu == total) if (total and (layers or offloaded)) else None,
        "layers_by_device": dict(layers),
        "weights_bytes_by_buffer": {b["buffer"]: b["bytes"] for b in buffers if b["kind"] == "model"},
        "buffers": buffers,
        "device_bytes": dict(device_bytes),
    }
