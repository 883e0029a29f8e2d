"""Tiny EAGLE-3 draft heads for synthetic.py's target, written with the `gguf` package, so EAGLE-3 drafting can be
built and tested on any machine. synthetic.py writes them with its MTP files (eagle3-agreeing.gguf,
eagle3-random.gguf); their target is any of those files (the heads read its trunk only).

An EAGLE-3 head (llama.cpp's src/models/eagle3.cpp) is one decoder layer with no token embedding or output matrix of
its own here: it borrows the target's. Its encoder fuses the inputs of three target layers (`target_layers`) at
position P into g_P (`fc`); its decoder at position P is fed the token of P+1 and g_P (a draft step: its own
draft and its previous pre-norm row) and predicts the token after.

In synthetic.py's target every layer's input is the token embedding E[t] (the trunk's output projections are zero)
and greedy decoding follows NEXT[t]. eagle3-agreeing therefore only has to pass the token it is fed through: its
attention (Q = K = a scaled copy of the layer's input, V = the token half) attends to its own position, whose
value is the token's normalised embedding; g enters the residual through a tiny hidden norm (norm_before_residual)
and the FFN adds nothing, so its pre-norm row is about rmsnorm(E[token]) and the target's output matrix reads
NEXT[token] from it: the target's next choice. `fc` passes layer 0's input on, so g_P is E[t_P] itself.
eagle3-random has random weights everywhere (right about 1 time in the vocabulary's size).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .synthetic_vocab import CONTEXT, N_EMBD, N_FF, _add_vocab, _f32, build_vocab

EAGLE3_HEADS = ("eagle3-agreeing", "eagle3-random")  # EAGLE-3 draft heads for synthetic.py's targets

HEADS = EAGLE3_HEADS

ARCH = "eagle3"
TARGET_LAYERS = (0, 1, 1)  # the synthetic target has two trunk layers; EAGLE-3 reads exactly three inputs
HEAD_DIM = 2 * N_EMBD  # one attention head over [token half | g half]
SELF_FOCUS = 4.0  # Q = K = SELF_FOCUS * input: a position's own score beats any other by tens of logits
G_WEIGHT = 1e-3  # the hidden norm's weight: g barely moves the agreeing head's residual


def agreeing_tensors() -> dict[str, np.ndarray]:
    """eagle3-agreeing (shapes as numpy sees them: ggml's reversed)."""
    eye, zeros = np.eye, np.zeros
    token_half = np.block([[eye(N_EMBD), zeros((N_EMBD, N_EMBD))], [zeros((N_EMBD, 2 * N_EMBD))]])
    return {
        "fc.weight": np.concatenate([eye(N_EMBD), zeros((N_EMBD, 2 * N_EMBD))], axis=1),
        "output_norm.weight": np.ones(N_EMBD),
        "blk.0.attn_norm.weight": np.ones(N_EMBD),
        "blk.0.attn_norm_2.weight": np.full(N_EMBD, G_WEIGHT),
        "blk.0.attn_q.weight": SELF_FOCUS * eye(HEAD_DIM),
        "blk.0.attn_k.weight": SELF_FOCUS * eye(HEAD_DIM),
        "blk.0.attn_v.weight": token_half,
        "blk.0.attn_output.weight": np.concatenate([eye(N_EMBD), zeros((N_EMBD, N_EMBD))], axis=1),
        "blk.0.ffn_norm.weight": np.ones(N_EMBD),
        "blk.0.ffn_gate.weight": zeros((N_FF, N_EMBD)),
        "blk.0.ffn_up.weight": zeros((N_FF, N_EMBD)),
        "blk.0.ffn_down.weight": zeros((N_EMBD, N_FF)),
    }


def random_tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """eagle3-random: the same shapes, random weights."""

    def rand(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 1.0 / np.sqrt(shape[-1]), size=shape)

    tensors = {name: rand(*array.shape) for name, array in agreeing_tensors().items() if array.ndim == 2}
    norms = {name: np.ones_like(array) for name, array in agreeing_tensors().items() if array.ndim == 1}
    return {**tensors, **norms}


def write_head(path: Path, tensors: dict[str, np.ndarray], name: str, agreeing: bool) -> None:
    import gguf  # the test extra's package: only this research tool needs it

    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_array(f"{ARCH}.target_layers", list(TARGET_LAYERS))
    writer.add_uint32(f"{ARCH}.target_hidden_size", N_EMBD)
    writer.add_bool(f"{ARCH}.norm_before_residual", agreeing)
    _add_vocab(writer, build_vocab())  # the target's vocabulary, as llama.cpp's converter copies it
    for tensor_name, array in tensors.items():
        writer.add_tensor(tensor_name, _f32(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write(path: Path, name: str, seed: int) -> None:
    """Write the head `name` (one of HEADS) to path."""
    agreeing = name == "eagle3-agreeing"
    tensors = agreeing_tensors() if agreeing else random_tensors(np.random.default_rng(seed + 3))
    write_head(path, tensors, f"synthetic {name}", agreeing)
