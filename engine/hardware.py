"""What this machine runs on: llama.cpp's backend, physical cores, and memory in use.

Every figure here is a reading. Where one cannot be read, the answer is None (shown as "n/a").
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

import psutil

log = logging.getLogger(__name__)

_GPU_DEVICE_TYPES = (1, 2)  # ggml_backend_dev_type: 0 CPU, 1 GPU, 2 integrated GPU, 3 accelerator


def physical_cores() -> int:
    """Cores llama.cpp should use by default: the physical ones, but no more than this process may run on."""
    return min(psutil.cpu_count(logical=False) or os.cpu_count() or 1, allowed_cpus())


def allowed_cpus() -> int:
    """CPUs this process may run on (`taskset`, a container's cpuset), which can be fewer than the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS and Windows have no affinity call here
        return os.cpu_count() or 1


@lru_cache(maxsize=1)
def ggml_library():
    """llama.cpp's ggml library, already loaded by llama_cpp, with the signatures SpecChat calls declared: its
    devices here, and the CPU backend's extra buffer types (decoding/repack.py)."""
    from llama_cpp import _ggml

    lib = _ggml.libggml
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_buft_name.restype = ctypes.c_char_p
    lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    return lib


@dataclass(frozen=True)
class Device:
    name: str  # e.g. "CUDA0", "Metal", "Vulkan0", "CPU"
    description: str
    is_gpu: bool
    handle: int


# Vulkan devices that are software on the CPU: Mesa's lavapipe (it names itself "llvmpipe"), Google's SwiftShader,
# Windows' WARP. Correct and slow, for testing; llama.cpp lists a CPU-type device only when GGML_VK_VISIBLE_DEVICES
# names it.
SOFTWARE_DEVICES = ("llvmpipe", "lavapipe", "swiftshader", "microsoft basic render")


def is_software_device(device: Device) -> bool:
    return device.is_gpu and any(name in device.description.lower() for name in SOFTWARE_DEVICES)


def devices() -> list[Device]:
    """The compute devices this llama.cpp build registered."""
    try:
        lib = ggml_library()
        out = []
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            out.append(
                Device(
                    name=(lib.ggml_backend_dev_name(dev) or b"?").decode(),
                    description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                    is_gpu=lib.ggml_backend_dev_type(dev) in _GPU_DEVICE_TYPES,
                    handle=dev,
                )
            )
        return out
    except (OSError, AttributeError, ImportError) as exc:  # an old or unusual build
        log.warning("cannot list llama.cpp devices: %s", exc)
        return []


# llama.cpp's AMX kernels (Intel Sapphire Rapids and later, in a build for that CPU) crash the process on
# multi-row steps: Gemma 3 270M Q4_K_M segfaulted in ggml_backend_amx_mul_mat on its first 2-row decode here
# (llama.cpp issue 20824, closed unfixed). Weights go to AMX buffers only as an "extra buffer type".
AMX_FEATURE = b"AMX_INT8 = 1"


@lru_cache(maxsize=1)
def cpu_uses_amx() -> bool:
    """The build's CPU backend has AMX kernels for this CPU (so weights would be repacked for them)."""
    import llama_cpp

    return AMX_FEATURE in (llama_cpp.llama_print_system_info() or b"")


def gpu_offload_supported() -> bool:
    """This llama.cpp build has a GPU backend (CUDA, Metal, Vulkan, ...), so GPU layers mean something.
    Read from the build, not the device list: a GPU build on a machine without a GPU still says True.
    True when the build cannot say, so a GPU setting is never locked by mistake."""
    try:
        import llama_cpp

        return bool(llama_cpp.llama_supports_gpu_offload())
    except (ImportError, AttributeError, OSError) as exc:  # an old or unusual build
        log.warning("cannot read llama.cpp's GPU offload support: %s", exc)
        return True


def backend_name() -> str:
    """ "CUDA", "Metal", "Vulkan", ... for the first GPU device of the build, else "CPU"."""
    for dev in devices():
        if dev.is_gpu:
            return dev.name.rstrip("0123456789") or dev.name
    return "CPU"


@dataclass(frozen=True)
class MemoryReading:
    bytes_used: int | None
    kind: str  # "VRAM" or "RAM"
    source: str  # where the figure came from
    device: str = ""  # the GPU's name, for VRAM ("NVIDIA GeForce RTX 4090", "llvmpipe")

    def label(self) -> str:
        if self.bytes_used is None:
            return f"{self.kind} n/a"
        return f"{self.kind} {self.bytes_used / 2**30:.2f} GiB" + (f" ({self.device})" if self.device else "")

    def to_dict(self) -> dict:
        """As the system check, the lab and the backend check report it."""
        return {
            "kind": self.kind,
            "bytes": self.bytes_used,
            "source": self.source,
            "device": self.device,
            "label": self.label(),
        }


def _nvml_process_bytes() -> int | None:
    """GPU memory this process holds, read from NVML (NVIDIA only; needs nvidia-ml-py)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        pid, total = os.getpid(), 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory:
                    total += proc.usedGpuMemory
        return total or None
    except Exception as exc:  # NVML missing driver, permissions, containers without pid mapping
        log.debug("NVML reading failed: %s", exc)
        return None


# What llama.cpp allocated on GPU devices for each open model (weights, KV cache, compute buffers), from its load
# log (decoding/load_log.py): owner id -> bytes. Kept here so every reader sums target and draft.
_device_buffers: dict[int, int] = {}


def note_device_buffers(owner: object, nbytes: int) -> None:
    _device_buffers[id(owner)] = nbytes


def forget_device_buffers(owner: object) -> None:
    _device_buffers.pop(id(owner), None)


def _ggml_gpu_bytes() -> int | None:
    """Device memory in use (total − free) on llama.cpp's GPUs, when the backend reports use. A backend without a
    budget to read (Vulkan without VK_EXT_memory_budget: Mesa's lavapipe before 23) says free == total whatever
    is allocated: that is no reading, not 0."""
    used, seen = 0, False
    for dev in devices():
        if dev.is_gpu:
            memory = device_memory(dev)
            if memory and memory[0] < memory[1]:
                used += memory[1] - memory[0]
                seen = True
    return used if seen else None


def gpu_name() -> str:
    """The first GPU device's own name, short: "NVIDIA GeForce RTX 4090", "llvmpipe" (its description, less the
    driver's details in brackets); "" when llama.cpp lists none."""
    for dev in devices():
        if dev.is_gpu:
            return (dev.description or dev.name).split(" (")[0].strip()
    return ""


NVML_SOURCE = "NVML, this process"
BUFFERS_SOURCE = "llama.cpp's buffers on the GPU, this process"
WHOLE_GPU_SOURCE = "llama.cpp device memory, whole GPU"


def read_memory(backend: str) -> MemoryReading:
    """VRAM when a GPU runs the model and can be read; otherwise this process's resident RAM. VRAM, in order: the
    driver's figure for this process (NVML), what llama.cpp allocated on the GPU for the open models (read from
    its load log), the device's whole use (ggml, which reads the Vulkan memory budget or CUDA's free memory)."""
    if backend != "CPU":
        name = gpu_name()
        nvml = _nvml_process_bytes()
        if nvml is not None:
            return MemoryReading(nvml, "VRAM", NVML_SOURCE, name)
        if _device_buffers:
            return MemoryReading(sum(_device_buffers.values()), "VRAM", BUFFERS_SOURCE, name)
        device = _ggml_gpu_bytes()
        if device is not None:
            return MemoryReading(device, "VRAM", WHOLE_GPU_SOURCE, name)
    return MemoryReading(psutil.Process().memory_info().rss, "RAM", "process resident set")


def device_memory(device: Device) -> tuple[int, int] | None:
    """(free, total) bytes of one llama.cpp device, as its backend reports them; None when it reports nothing."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    try:
        ggml_library().ggml_backend_dev_memory(device.handle, ctypes.byref(free), ctypes.byref(total))
    except (OSError, AttributeError) as exc:
        log.debug("cannot read %s's memory: %s", device.name, exc)
        return None
    return (free.value, total.value) if total.value else None


def _nvml_gpu_names() -> list[str]:
    """The GPUs NVML lists; raises ImportError without nvidia-ml-py, or NVML's error (no driver, a container)."""
    import pynvml

    pynvml.nvmlInit()
    names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def nvidia_gpus() -> tuple[list[str], str]:
    """The NVIDIA GPUs this machine shows, whatever llama.cpp was built with, and how they were seen (or why
    none could be): NVML first (nvidia-ml-py), else `nvidia-smi -L`."""
    try:
        return _nvml_gpu_names(), "NVML"
    except ImportError:
        nvml = "nvidia-ml-py not installed"
    except Exception as exc:  # no driver, a container without the device
        nvml = f"NVML: {exc}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], f"{nvml}; nvidia-smi not found"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"{nvml}; nvidia-smi failed: {exc}"
    names = [
        line.split(":", 1)[1].split("(UUID")[0].strip()
        for line in out.stdout.splitlines()
        if line.startswith("GPU ") and ":" in line
    ]
    return names, "nvidia-smi" if names else f"{nvml}; nvidia-smi lists no GPU"


def _nvml_lists_gpus() -> bool:
    try:
        return bool(_nvml_gpu_names())
    except Exception:  # noqa: BLE001 - ImportError, or NVML's own errors: NVML cannot read VRAM here
        return False


_READER_WHY = {
    NVML_SOURCE: "per-process VRAM from the NVIDIA driver",
    BUFFERS_SOURCE: "what llama.cpp allocated on the GPU for SpecChat's models (weights, KV cache, compute), "
    "from its load log",
    WHOLE_GPU_SOURCE: "NVML gives no per-process figure here (install nvidia-ml-py on NVIDIA), so the whole GPU's "
    "use is shown",
}


def vram_reader(backend: str) -> tuple[str | None, str]:
    """Which reading read_memory gives for a model on `backend`: (source, why), source None when VRAM cannot be
    read (the figure then shows the process's RAM, labelled RAM)."""
    if backend == "CPU":
        return None, "the model runs on the CPU (this llama.cpp build, or GPU layers set to 0): RAM is shown"
    # What an answer shows once a model is open, whether or not one is now (the system check reads the machine first)
    if _nvml_lists_gpus():  # (NVML only: nvidia-smi cannot read a process's VRAM)
        return NVML_SOURCE, _READER_WHY[NVML_SOURCE]
    if gpu_name():  # its load log says what llama.cpp puts on the GPU
        return BUFFERS_SOURCE, _READER_WHY[BUFFERS_SOURCE]
    if _ggml_gpu_bytes() is not None:
        return WHOLE_GPU_SOURCE, _READER_WHY[WHOLE_GPU_SOURCE]
    return None, f"neither NVML nor the {backend} backend reports memory"


def free_gpu_memory() -> int | None:
    """Free bytes on the first real GPU this build can use; None on a CPU build or where none reports memory."""
    for device in devices():
        if device.is_gpu and not is_software_device(device):
            reading = device_memory(device)
            if reading is not None:
                return reading[0]
    return None
