"""The one tiny model: a real GGUF file llama.cpp reads (a 1-layer llama header and a SentencePiece vocabulary),
written in milliseconds. Tests take the plain one from the session fixture `tiny` (tests/conftest.py) and write
the variants they need (a chat template, control tokens, a payload to download in pieces) with write_tiny_gguf."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tiny_gguf(
    path: Path,
    tokens: list[str] | None = None,
    payload_bytes: int = 0,
    seed: int = 0,
    control_tokens: list[str] = (),
    chat_template: str | None = None,
    complete: bool = False,
    context_length: int = 64,
) -> Path:
    """A real, llama.cpp-loadable (vocab_only) GGUF: a 1-layer llama header and a SentencePiece vocab.

    payload_bytes of random weights make the file big enough to download in several pieces.
    tokens[1] and tokens[2] are BOS and EOS; control_tokens are appended as further CONTROL tokens,
    and chat_template is stored as tokenizer.chat_template. complete writes every weight of the layer
    (zeros), so llama.cpp also loads it whole, as engine.modelfiles.model_check does.
    """
    import gguf

    tokens = list(tokens or default_tokens()) + list(control_tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_context_length(context_length)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    types = [gguf.TokenType.NORMAL] * len(tokens)
    types[0], types[1], types[2] = gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL
    for i in range(len(tokens) - len(control_tokens), len(tokens)):
        types[i] = gguf.TokenType.CONTROL
    writer.add_token_types(types)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    if complete:
        for name, shape in (
            ("output_norm", (8,)),
            ("blk.0.attn_norm", (8,)),
            ("blk.0.attn_q", (8, 8)),
            ("blk.0.attn_k", (8, 8)),
            ("blk.0.attn_v", (8, 8)),
            ("blk.0.attn_output", (8, 8)),
            ("blk.0.ffn_norm", (8,)),
            ("blk.0.ffn_gate", (16, 8)),
            ("blk.0.ffn_up", (16, 8)),
            ("blk.0.ffn_down", (8, 16)),
        ):
            writer.add_tensor(f"{name}.weight", np.zeros(shape, dtype=np.float32))
    if payload_bytes:
        rng = np.random.default_rng(seed)
        writer.add_tensor("payload.weight", rng.random(payload_bytes // 4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def default_tokens() -> list[str]:
    return ["<unk>", "<s>", "</s>"] + [f"\u2581w{i}" for i in range(300)]
