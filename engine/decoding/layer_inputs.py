"""The inputs of some of a target's layers, by sequence and position: what an EAGLE-3 head is fed (its "features":
for each token, the inputs of its three target layers side by side).

llama.cpp keeps them for the last decode only (llama_get_embeddings_layer_inp: one row per token of it), so the
target's Model records each decode's here, as it does its hidden rows for an MTP head (hidden_rows.py); the store
mirrors its KV cache.

llama.cpp aborts the process (GGML_ASSERT) on a decode whose graph gives no input tensor for a layer switched on,
so only the architectures whose graphs give one (src/models/*.cpp setting `res->t_layer_inp[il]` for every layer,
one n_embd-wide row per token) are switched on; `layer_input_problem` says why not for any other.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp as L
import numpy as np

from . import head_ext
from .hidden_rows import HiddenRows

# llama.cpp architectures (general.architecture) whose graph exposes every layer's input, in llama-cpp-python
# 0.3.36. Left out: qwen4exp (its rows are hyper-connection wide, which llama.cpp's extraction asserts against).
LAYER_INPUT_ARCHS = frozenset(
    {
        "llama",
        "nanbeige",
        "qwen3",
        "qwen3moe",
        "qwen3next",
        "qwen35",
        "qwen35moe",
        "muse-glimmer",
        "deepseek4",
        "nemotron_h",
        "nemotron_h_moe",
        "bailingmoe3",
        "hunyuan_vl",
        "hunyuan-dense",
        "gpt-oss",
        "lfm2",
        "minimax-01",
        "minimax-m2",
        "mimo2",
    }
)


def layer_input_problem(arch: str, n_layer: int, layers: Sequence[int]) -> str | None:
    """Why llama.cpp cannot give these layers' inputs on a target of this architecture and depth, or None."""
    missing = head_ext.available()
    if missing:
        return missing
    if arch not in LAYER_INPUT_ARCHS:
        return f"this llama.cpp cannot read the hidden states of a {arch} model's layers, which the head is fed."
    beyond = [lid for lid in layers if not 0 <= lid < n_layer]
    if beyond:
        return f"the head reads layer {beyond[0]}; the target's layers are 0 to {n_layer - 1}."
    return None


class LayerInputs:
    """The inputs of `layers` (in that order, a layer may repeat) of every token decoded, side by side per row."""

    def __init__(self, layers: Sequence[int], n_embd: int):
        self.layers, self.n_embd = list(layers), n_embd
        self.width = len(self.layers) * n_embd
        self.rows = HiddenRows()

    def switch_on(self, ctx: L.llama_context_p) -> None:
        """The context keeps these layers' inputs from its next decode on (a new context starts empty)."""
        for lid in sorted(set(self.layers)):
            head_ext.set_layer_inputs(ctx, lid, True)
        self.rows.forget_all()

    def record(self, ctx: L.llama_context_p, positions: Sequence[int] | np.ndarray, seq_ids: Sequence[int]) -> None:
        """The last decode's rows (its batch row i at positions[i] of seq_ids[i])."""
        n = len(positions)
        block = np.empty((n, self.width), dtype=np.float32)
        for k, lid in enumerate(self.layers):
            ptr = head_ext.layer_inputs(ctx, lid)
            if not ptr:  # never expected after a decode: the head then guesses from zeros
                block[:, k * self.n_embd : (k + 1) * self.n_embd] = 0.0
                continue
            block[:, k * self.n_embd : (k + 1) * self.n_embd] = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))
        self.rows.record(positions, seq_ids, block)
