"""Where a model's layers went and the memory figure beside each answer, read from llama.cpp on this build (the CPU
build here; packaging/vulkan_check.sh runs this file on the Vulkan backend over lavapipe, and gpu_check.sh could on
CUDA), and from a real lavapipe load log kept in tests/engine/data."""

from pathlib import Path

import pytest

from engine import hardware
from engine.decoding.load_log import placement
from engine.decoding.runtime import LoadSettings, Model
from engine.modelfiles.embedded import resolve_model

from support.this_build import BACKEND, GPU_OFFLOAD, MEMORY_KIND, ON_GPU

SMOLLM2_LAYERS = 31  # 30 blocks and the output layer, as llama.cpp counts them
LAVAPIPE_LOG = Path(__file__).parent / "data" / "lavapipe_load_log.txt"


@pytest.fixture(scope="module")
def smollm2():
    with Model(resolve_model("embedded"), LoadSettings(n_ctx=512, n_gpu_layers=-1)) as model:
        yield model


def test_the_placement_is_read_from_llama_cpps_own_load_log(smollm2):
    where = smollm2.placement
    assert where["layers"] == SMOLLM2_LAYERS
    assert where["layers_on_gpu"] == (SMOLLM2_LAYERS if ON_GPU else 0)
    assert where["all_layers_offloaded"] is ON_GPU
    assert {b["kind"] for b in where["buffers"]} >= {"model", "KV", "compute"}
    on_device = [b for b in where["buffers"] if b["buffer"] in where["device_bytes"]]
    weights = sum(b["bytes"] for b in (on_device if ON_GPU else where["buffers"]) if b["kind"] == "model")
    assert 80 * 2**20 < weights < 100 * 2**20  # the 98 MB file's weights (a GPU build keeps a copy of the input
    if ON_GPU:  # embeddings on the CPU besides), with the KV cache and compute
        assert {b["kind"] for b in on_device} >= {"model", "KV", "compute"}  # buffers on the device
        assert sum(where["device_bytes"].values()) == sum(b["bytes"] for b in on_device) > weights
    else:
        assert where["device_bytes"] == {}


def test_the_memory_figure_names_the_gpu_and_counts_what_llama_cpp_put_there(smollm2):
    reading = hardware.read_memory(smollm2.backend)
    assert smollm2.backend == BACKEND and reading.kind == MEMORY_KIND and reading.bytes_used > 0
    if MEMORY_KIND == "VRAM":
        assert reading.device and reading.label().endswith(f"({reading.device})")
        if reading.source == hardware.BUFFERS_SOURCE:
            assert reading.bytes_used == sum(smollm2.placement["device_bytes"].values())
    else:
        assert reading.label().startswith("RAM ") and reading.device == ""


def test_gpu_layers_zero_keeps_every_layer_on_the_cpu():
    with Model(resolve_model("embedded"), LoadSettings(n_ctx=512, n_gpu_layers=0)) as model:
        assert model.placement["layers_on_gpu"] == 0 and model.backend == "CPU"
        # No weights on a GPU (a GPU build still puts compute buffers there, for the big batches it offloads)
        assert not [
            b
            for b in model.placement["buffers"]
            if b["kind"] == "model" and b["buffer"] in model.placement["device_bytes"]
        ]
        assert hardware.read_memory(model.backend).kind == "RAM"


@pytest.mark.skipif(not GPU_OFFLOAD, reason="a GPU build's partial offload (packaging/vulkan_check.sh runs it)")
def test_some_gpu_layers_offload_that_many():
    with Model(resolve_model("embedded"), LoadSettings(n_ctx=512, n_gpu_layers=10)) as model:
        assert model.placement["layers_on_gpu"] == 10 and not model.placement["all_layers_offloaded"]


def test_a_closed_model_no_longer_counts_towards_vram():
    model = Model(resolve_model("embedded"), LoadSettings(n_ctx=512, n_gpu_layers=-1))
    before = dict(hardware._device_buffers)
    model.close()
    assert id(model) not in hardware._device_buffers
    assert set(hardware._device_buffers) <= set(before)


def test_a_real_lavapipe_load_log():
    """llama.cpp 0.3.36 on Vulkan over Mesa 22.3's lavapipe, SmolLM2 with every layer offloaded (vulkan_check.sh)."""
    where = placement(LAVAPIPE_LOG.read_text(), ["Vulkan0"])
    assert where["layers"] == SMOLLM2_LAYERS and where["layers_on_gpu"] == SMOLLM2_LAYERS
    assert where["all_layers_offloaded"] is True
    on_device = [b for b in where["buffers"] if b["buffer"] == "Vulkan0"]
    assert {b["kind"] for b in on_device} >= {"model", "KV", "compute"}
    assert where["device_bytes"] == {"Vulkan0": sum(b["bytes"] for b in on_device)}  # host buffers not counted


def test_a_device_that_reports_no_use_is_no_reading(monkeypatch):
    """Vulkan without VK_EXT_memory_budget (lavapipe in Mesa 22) says free == total whatever is allocated: no
    reading, not 0 (a mock: no such device is readable here)."""
    gpu = hardware.Device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", True, 0)
    monkeypatch.setattr(hardware, "devices", lambda: [gpu])
    monkeypatch.setattr(hardware, "device_memory", lambda dev: (2**31, 2**31))
    assert hardware._ggml_gpu_bytes() is None
    monkeypatch.setattr(hardware, "device_memory", lambda dev: (2**30, 2**31))
    assert hardware._ggml_gpu_bytes() == 2**30
    assert hardware.gpu_name() == "llvmpipe" and hardware.is_software_device(gpu)
