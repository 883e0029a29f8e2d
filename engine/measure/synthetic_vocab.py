"""The synthetic GGUF files' shared parts (synthetic.py's targets, synthetic_eagle3.py's heads): their width, context and
vocabulary, and how a vocabulary and F32 tensors are written.

The vocabulary is SentencePiece-style ("llama"): <unk> <s> </s>, the 256 byte tokens (so any UTF-8 text tokenizes by
byte fallback), the printable ASCII characters and a few two-letter pieces, no string twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

N_EMBD = 64
N_FF = 64
CONTEXT = 8192
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_PAIRS = ("th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of", "ed", "is", "it")
_UNK, _BOS, _EOS = 0, 1, 2
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6  # gguf.TokenType values


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]
    pieces: list[int]  # ids of the printable pieces, the tokens greedy decoding cycles through


def build_vocab() -> Vocab:
    """Specials, the 256 byte tokens, the printable characters (space as SentencePiece's '▁') and some pairs."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [_UNKNOWN, _CONTROL, _CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [_BYTE] * 256
    chars = ["▁"] + [chr(c) for c in range(0x21, 0x7F)]
    pairs = list(_PAIRS) + ["▁" + p[0] for p in _PAIRS]
    first_piece = len(tokens)
    pairs = sorted(set(pairs), key=pairs.index)
    tokens += chars + pairs
    types += [_NORMAL] * (len(chars) + len(pairs))
    if len(set(tokens)) != len(tokens):
        raise RuntimeError("the synthetic vocabulary has a token twice")
    # SentencePiece merges the highest-scoring pair first: the two-letter pieces score above the characters.
    scores = [0.0] * first_piece + [-1.0 - i for i in range(len(chars))] + [1.0 - i / 100 for i in range(len(pairs))]
    return Vocab(tokens, scores, types, list(range(first_piece, len(tokens))))


def _f32(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32)


def _add_vocab(writer: Any, vocab: Vocab) -> None:  # a gguf.GGUFWriter (gguf is imported only when writing)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    writer.add_unk_token_id(_UNK)
    writer.add_bos_token_id(_BOS)
    writer.add_eos_token_id(_EOS)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
