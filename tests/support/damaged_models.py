"""Damaged copies of a real GGUF file, the way one bit flip or a careless converter makes them,
and a tiny recurrent (Mamba) model: real files llama.cpp reads, for the model-file safety tests."""

from __future__ import annotations

import shutil
import struct
from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np

from .tiny import default_tokens

ALIGNMENT = 32  # GGUF's default: tensor data starts at a multiple of it


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF type id -> bytes
_STRING, _ARRAY = 8, 9


@lru_cache(maxsize=4)
def _layout(src: Path, mtime_ns: int) -> tuple[dict[str, int], list[tuple[int, bytes]]]:
    """Where each key's value starts in the file, and each token text's (offset, bytes): one walk over the
    header with struct (gguf.GGUFReader takes ~27 s over Gemma's 262k-token vocabulary; this, under one)."""
    data = Path(src).read_bytes()[: 64 << 20]  # the header sits at the start
    _, _, _, kvs = struct.unpack_from("<4sIQQ", data)
    pos, values, tokens = 24, {}, []

    def skip(kind: int, at: int, collect: list | None = None) -> int:
        if kind == _STRING:
            (n,) = struct.unpack_from("<Q", data, at)
            if collect is not None:
                collect.append((at + 8, data[at + 8 : at + 8 + n]))
            return at + 8 + n
        if kind == _ARRAY:
            inner, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if inner in _SCALAR_SIZES:
                return at + count * _SCALAR_SIZES[inner]
            for _ in range(count):
                at = skip(inner, at, collect)
            return at
        return at + _SCALAR_SIZES[kind]

    for _ in range(kvs):
        (n,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8 : pos + 8 + n].decode()
        (kind,) = struct.unpack_from("<I", data, pos + 8 + n)
        values[key] = pos + 12 + n
        pos = skip(kind, pos + 12 + n, tokens if key == "tokenizer.ggml.tokens" else None)
    return values, tokens


def _patched_copy(src: Path, dst: Path, offset: int, raw: bytes) -> Path:
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(raw)
    return Path(dst)


def with_number(src: Path, dst: Path, key: str, value: int) -> Path:
    """A copy with one existing uint32 value changed in place."""
    values, _ = _layout(Path(src), Path(src).stat().st_mtime_ns)
    return _patched_copy(src, dst, values[key], struct.pack("<I", value))


def token_to_duplicate(src: Path) -> tuple[int, bytes]:
    """(offset, text) of a lowercase token whose capitalised text is another token ('ing', as 'Ing' exists)."""
    _, tokens = _layout(Path(src), Path(src).stat().st_mtime_ns)
    texts = {text for _, text in tokens}
    for offset, token in tokens:
        if len(token) > 2 and token.isalpha() and token.islower() and token.capitalize() in texts:
            return offset, token
    raise AssertionError("no token to duplicate")


def with_duplicate_token(src: Path, dst: Path) -> tuple[Path, bytes]:
    """A copy where one bit flip turns a token's text into another token's ('ing' -> 'Ing')."""
    offset, token = token_to_duplicate(src)
    return _patched_copy(src, dst, offset, bytes([token[0] ^ 0x20])), token.capitalize()


def with_added_key(src: Path, dst: Path, key: str, value: int | str) -> Path:
    """A copy with one more key/value after the header, padded so the tensor data stays aligned."""
    data = Path(src).read_bytes()
    entry = _kv(key, value)
    count = 1
    if len(entry) % ALIGNMENT:  # a harmless second key absorbs the difference
        pad = 0
        while (len(entry) + len(_kv("specchat.pad" + "x" * pad, ""))) % ALIGNMENT:
            pad += 1
        entry += _kv("specchat.pad" + "x" * pad, "")
        count = 2
    magic, version, tensors, kvs = struct.unpack_from("<4sIQQ", data)
    Path(dst).write_bytes(struct.pack("<4sIQQ", magic, version, tensors, kvs + count) + entry + data[24:])
    return Path(dst)


def _kv(key: str, value: int | str) -> bytes:
    name = key.encode()
    if isinstance(value, str):
        text = value.encode()
        payload = struct.pack("<IQ", 8, len(text)) + text  # GGUF string
    else:
        payload = struct.pack("<II", 4, value)  # GGUF uint32
    return struct.pack("<Q", len(name)) + name + payload


def write_tiny_mamba(path: Path, eos: int = 2) -> Path:
    """A one-layer Mamba with random weights: a real recurrent model llama.cpp loads and runs.
    eos: its end-of-text token (pick one it writes, for answers that end on their own)."""
    tokens = default_tokens()
    n_vocab, n_embd, d_inner, d_state, d_conv, dt_rank = len(tokens), 16, 32, 4, 4, 2
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_name("tiny-mamba")
    writer.add_context_length(256)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(1)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_head_count_kv(0)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    types = [gguf.TokenType.NORMAL] * n_vocab
    types[0], types[1], types[2] = gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos)
    rng = np.random.default_rng(0)
    shapes = {  # llama.cpp's (ne0, ne1) order; numpy wants them reversed
        "token_embd.weight": (n_embd, n_vocab),
        "output_norm.weight": (n_embd,),
        "blk.0.attn_norm.weight": (n_embd,),
        "blk.0.ssm_in.weight": (n_embd, 2 * d_inner),
        "blk.0.ssm_conv1d.weight": (d_conv, d_inner),
        "blk.0.ssm_conv1d.bias": (d_inner,),
        "blk.0.ssm_x.weight": (d_inner, dt_rank + 2 * d_state),
        "blk.0.ssm_dt.weight": (dt_rank, d_inner),
        "blk.0.ssm_dt.bias": (d_inner,),
        "blk.0.ssm_a": (d_state, d_inner),
        "blk.0.ssm_d": (d_inner,),
        "blk.0.ssm_out.weight": (d_inner, n_embd),
    }
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape[::-1]) * 0.1).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
