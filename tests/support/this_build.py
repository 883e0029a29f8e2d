"""What this machine's llama.cpp build runs on, read from the build and the machine: tests that check a backend,
a memory label or where layers went expect these, so the one suite passes on the CPU build here and on a GPU
build (packaging/gpu_check.sh runs it there)."""

from engine.hardware import backend_name, gpu_offload_supported, nvidia_gpus, vram_reader

BACKEND = backend_name()  # "CPU" here
ON_GPU = BACKEND != "CPU"
GPU_OFFLOAD = gpu_offload_supported()  # False here
MEMORY_KIND = "VRAM" if ON_GPU and vram_reader(BACKEND)[0] else "RAM"
# the lab's utilisation: NVML's GPU figure where a GPU runs the model and NVML lists one, else this process's CPU
UTILISATION_KIND = "GPU" if ON_GPU and nvidia_gpus()[1] == "NVML" else "CPU"
