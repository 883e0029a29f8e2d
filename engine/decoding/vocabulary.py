"""A loaded model's vocabulary through llama-cpp-python's low-level API: token ids to text and back, and what a
token means (an end of generation, the start token). runtime.Model is one; a token's piece and whether it ends an
answer are read once and kept, as the decode loop asks for them every step."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp as L


class Vocabulary:
    """Token ids and text for one loaded llama.cpp vocabulary (set by _open_vocabulary)."""

    vocab: L.llama_vocab_p
    n_vocab: int

    def _open_vocabulary(self, vocab: L.llama_vocab_p) -> None:
        self.vocab = vocab
        self.n_vocab = L.llama_vocab_n_tokens(vocab)
        self._pieces: dict[int, bytes] = {}
        self._ends: dict[int, bool] = {}
        self._max_token_bytes: int | None = None

    @property
    def bos(self) -> int:
        return int(L.llama_vocab_bos(self.vocab))

    @property
    def eos(self) -> int:
        return int(L.llama_vocab_eos(self.vocab))

    @property
    def adds_bos(self) -> bool:
        return bool(L.llama_vocab_get_add_bos(self.vocab))

    def is_end(self, token: int) -> bool:
        end = self._ends.get(token)
        if end is None:  # a ctypes call per token adds up: every draft token is checked each step
            end = self._ends[token] = bool(L.llama_vocab_is_eog(self.vocab, token))
        return end

    def token_text(self, token: int) -> bytes:
        return L.llama_vocab_get_text(self.vocab, token) or b""

    def max_token_bytes(self) -> int:
        """The longest token text in the vocabulary, in bytes: no token stands for more bytes of text (a piece
        is never longer than its token's text), so a text of more than n times this is more than n tokens.
        Read once (0.4 s for Gemma's 262,144 tokens, 0.09 s for SmolLM2's 49,152)."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max(1, max(len(self.token_text(t)) for t in range(self.n_vocab)))
        return self._max_token_bytes

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_bos, special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token as text (control tokens render as nothing). Cached per model."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")
