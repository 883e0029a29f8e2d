"""The EAGLE-3 / DFlash calls of llama.cpp's staging header (src/llama-ext.h) that llama-cpp-python 0.3.36 does not
bind: the wheel exports them only under their C++ (Itanium-mangled) names, so they are bound here with ctypes.

- set_layer_inputs(ctx, lid, on): a context keeps the input of its layer `lid` for every token of each decode;
- layer_inputs(ctx, lid): those rows of the last decode (n_tokens x n_embd), None where llama.cpp has none.
The layers a head reads are read from its GGUF header (model_inspect.py), as llama.cpp reads them.

llama.cpp aborts (GGML_ASSERT) on get_embeddings_layer_inp for a layer that was not switched on or not decoded yet,
and on a decode whose graph has no input tensor for a switched-on layer: the target's Model reads a layer only after
a decode with it on, and layer_inputs.layer_input_problem refuses the second before a layer is switched on.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp as L

_lib = L.llama_cpp._lib
_ctx_p = L.llama_context_p_ctypes


def _bind(names: tuple[str, ...], argtypes: list[Any], restype: Any) -> Any:
    for name in names:
        func = getattr(_lib, name, None)
        if func is not None:
            func.argtypes, func.restype = argtypes, restype
            return func
    return None  # another build: the heads are then unavailable (available() says so)


_set_layer_inp = _bind(
    ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb"),
    [_ctx_p, ctypes.c_uint32, ctypes.c_bool],
    None,
)
_get_layer_inp = _bind(
    ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj"),
    [_ctx_p, ctypes.c_uint32],
    ctypes.POINTER(ctypes.c_float),
)


def available() -> str | None:
    """None where this llama.cpp build exports every call the heads need, else which one it lacks."""
    for name, func in (
        ("llama_set_embeddings_layer_inp", _set_layer_inp),
        ("llama_get_embeddings_layer_inp", _get_layer_inp),
    ):
        if func is None:
            return f"this llama.cpp build does not export {name}."
    return None


def set_layer_inputs(ctx: L.llama_context_p, lid: int, on: bool) -> None:
    _set_layer_inp(ctx, lid, on)


def layer_inputs(ctx: L.llama_context_p, lid: int) -> ctypes._Pointer[ctypes.c_float]:
    """The inputs of layer lid for every token of the context's last decode (lid switched on before it)."""
    ptr: ctypes._Pointer[ctypes.c_float] = _get_layer_inp(ctx, lid)
    return ptr
