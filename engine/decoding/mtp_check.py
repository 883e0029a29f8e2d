"""Whether llama.cpp can run a model's MTP ("nextn") head without aborting the process (GGML_ASSERT, no exception):
checked on the loaded model before any MTP context is made (mtp_head.py, and the target's Model in runtime.py)."""

from __future__ import annotations

import ctypes

import llama_cpp as L

PINNED = "0.3.36"  # the MTP API is marked work in progress upstream
SINGLE_HEAD_ARCHS = ("qwen35", "qwen35moe", "glm4moe")  # their MTP graphs assert exactly one nextn layer


def _architecture(model: L.llama_model_p) -> str:
    buf = ctypes.create_string_buffer(128)
    n = L.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n > 0 else ""


def mtp_problem(model: L.llama_model_p, loaded_with_mtp: bool) -> str | None:
    """Why an MTP context on this model would fail or abort the process; None where it can be made."""
    if L.__version__ != PINNED:
        return f"MTP drafting is pinned to llama-cpp-python {PINNED} (this is {L.__version__})."
    layers = L.llama_model_n_layer_nextn(model)
    if layers <= 0:
        return "the model has no MTP (nextn) layers."
    if not loaded_with_mtp:
        return "the model was loaded without its MTP layers (load_mtp): llama.cpp would abort."
    arch = _architecture(model)
    if arch in SINGLE_HEAD_ARCHS and layers != 1:
        return f"llama.cpp's {arch} MTP graph takes exactly one nextn layer; this model has {layers}."
    return None
