"""Tiny EAGLE-3 / DFlash draft-head GGUF files, for header reading only (nothing loads them): the keys and tensor
names llama.cpp's converters write (src/llama-arch.cpp: `<arch>.target_layers`, `<arch>.target_hidden_size`;
src/models/eagle3.cpp: fc.weight of 3 x the target's hidden size, one decoder layer), with small zero weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_head_gguf(
    path: Path,
    kind: str = "eagle3",
    target_layers: tuple[int, ...] = (0, 1, 1),
    target_hidden: int = 64,
    tokens: list[str] | None = None,
    width: int = 32,
) -> Path:
    """A head of architecture kind reading target_layers of a target of hidden size target_hidden; with tokens, it
    carries that vocabulary (SentencePiece-style, as the tiny models do)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), kind)
    writer.add_name(path.stem)
    writer.add_block_count(1)
    writer.add_embedding_length(width)
    writer.add_context_length(2048)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_array(f"{kind}.target_layers", list(target_layers))
    writer.add_uint32(f"{kind}.target_hidden_size", target_hidden)
    if tokens is not None:
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores([0.0] * len(tokens))
        writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    writer.add_tensor("fc.weight", np.zeros((width, len(target_layers) * target_hidden), dtype=np.float32))
    for name, shape in (("attn_norm", (width,)), ("attn_norm_2", (width,)), ("attn_q", (width, 2 * width))):
        writer.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.zeros((width,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
