"""Weights repacked for llama.cpp's CPU kernels without its AMX ones (engine/decoding/repack.py)."""

import re

import numpy as np
import pytest

from engine import hardware
from engine.decoding import repack, runtime
from engine.decoding.runtime import LoadSettings, Model
from engine.modelfiles.gguf_header import TensorInfo, read_gguf_tensors

Q4_K, Q6_K, Q5_0, F32 = 12, 14, 6, 0


def test_the_types_are_llama_cpps_for_the_cpus_features():
    assert repack.repack_types(b"CPU : SSE3 = 1 | ") == frozenset()
    assert repack.repack_types(b"CPU : AVX2 = 1 | ") == repack.AVX2_TYPES
    assert repack.repack_types(b"CPU : AVX2 = 1 | AVX512 = 1 | ") == repack.AVX2_TYPES | repack.AVX512_TYPES
    assert Q6_K not in repack.AVX2_TYPES | repack.AVX512_TYPES  # ARM only: forced here, it crashed the load


def test_only_matrices_every_architecture_multiplies_are_chosen():
    tensors = [
        TensorInfo("token_embd.weight", Q4_K, (1536, 151936)),  # read row by row: never
        TensorInfo("output.weight", Q4_K, (1536, 151936)),
        TensorInfo("blk.0.attn_q.weight", Q4_K, (1536, 1536)),
        TensorInfo("blk.0.attn_v.weight", Q6_K, (1536, 256)),  # a type CPU_REPACK does not take here
        TensorInfo("blk.0.ffn_down.weight", Q4_K, (8960, 1532)),  # rows not in eights
        TensorInfo("blk.0.attn_norm.weight", F32, (1536,)),
        TensorInfo("blk.0.ffn_gate_shexp.weight", Q4_K, (64, 64)),
        TensorInfo("blk.0.ssm_in.weight", Q4_K, (64, 64)),  # not known to be a plain matmul everywhere
        TensorInfo("blk.0.ffn_up_exps.weight", Q4_K, (64, 64, 8)),
    ]
    assert repack.repacked_tensors(tensors, repack.AVX2_TYPES) == [
        "output.weight",
        "blk.0.attn_q.weight",
        "blk.0.ffn_gate_shexp.weight",
    ]


def test_the_patterns_match_exactly_the_chosen_names(gemma_path):
    tensors = read_gguf_tensors(gemma_path)
    chosen = repack.repacked_tensors(tensors, repack.AVX2_TYPES | repack.AVX512_TYPES)
    patterns = [re.compile(p) for p in repack.name_patterns(chosen)]
    assert chosen and len(patterns) < len(chosen) / 2  # grouped by role, not one per name
    matched = [t.name for t in tensors if any(p.search(t.name) for p in patterns)]  # llama.cpp's regex_search
    assert matched == chosen


def test_the_tensor_list_is_read_from_the_file(gemma_path):
    tensors = read_gguf_tensors(gemma_path)
    names = {t.name for t in tensors}
    assert "token_embd.weight" in names and "blk.0.attn_q.weight" in names
    assert all(1 <= len(t.shape) <= 4 for t in tensors)
    embd = next(t for t in tensors if t.name == "token_embd.weight")
    assert embd.shape[1] == 262144  # Gemma 3's vocabulary: ne[1] is the rows


needs_amx = pytest.mark.skipif(
    not hardware.cpu_uses_amx() or repack.cpu_repack_buffer_type() is None,
    reason="repacking by name happens on AMX CPUs only (elsewhere llama.cpp repacks)",
)


@needs_amx
def test_a_repacked_model_computes_what_the_unpacked_one_does(gemma_path, monkeypatch):
    """The repacked weights are the same weights: a 4-row step (the repacked kernels' block) gives the same
    logits as the unpacked load, up to the rounding of another summation order, and the same argmax."""

    def last_rows(model):
        tokens = model.tokenize("The history of the printing press begins in")
        model.decode(tokens[:-4], 0, 0)
        return np.array(model.decode(tokens[-4:], len(tokens) - 4, 4))

    with Model(gemma_path, LoadSettings(n_ctx=256, threads=2)) as packed:
        assert packed.repacked_weights > 0
        repacked = last_rows(packed)
    unpacked_params = runtime.model_params
    monkeypatch.setattr(runtime, "model_params", lambda path=None, gpu=0: unpacked_params(None, gpu))
    with Model(gemma_path, LoadSettings(n_ctx=256, threads=2)) as plain:
        assert plain.repacked_weights == 0
        reference = last_rows(plain)
    assert (repacked.argmax(axis=1) == reference.argmax(axis=1)).all()
    assert np.abs(repacked - reference).max() < 0.05 * np.abs(reference).max()
