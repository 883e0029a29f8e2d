"""A model's own MTP ("nextn") head driven through llama.cpp's graphs, as common/speculative.cpp's draft-mtp does in
the pinned llama.cpp (llama-cpp-python 0.3.36): the foundation an MTP proposer builds on, the probe that shows a
file's head is what it claims (`head_agreement`) and a plain greedy speculative loop (`speculative_greedy`).

The protocol (../shared/DESIGN.md, "Built-in drafters"): the model is loaded once with `load_mtp`; the target
context emits its hidden states (`set_embeddings_nextn(tgt, true, false)`: one row per token decoded); a second
context on the same model, of type MTP, runs the head. After each target decode a catch-up batch gives the MTP
context each decoded token k paired with the target's hidden row of token k-1 (the first with the row kept from
the decode before); a draft feeds (token, position, the head's own hidden row) back in. On n accepted drafts the
row carried on is the verify batch's row n.

llama.cpp aborts the process (GGML_ASSERT, no exception) on an MTP context of a model loaded without `load_mtp`,
and on a qwen35 / glm4-moe head count other than one; `MtpModel` refuses those before llama.cpp sees them, and
every hidden row is read through a null-checked pointer (llama.cpp returns NULL for an id it cannot serve).
This API is marked work in progress upstream: it is pinned to llama-cpp-python 0.3.36.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as L
import numpy as np
from llama_cpp import llama_cpp_ext as X

from ..errors import ModelFileError, SpeculationUnavailable
from .mtp_check import PINNED, SINGLE_HEAD_ARCHS, mtp_problem
from .runtime import LoadSettings, _init_backend, _lifecycle

__all__ = ["PINNED", "SINGLE_HEAD_ARCHS", "MtpHead", "MtpModel", "head_agreement", "mtp_problem", "speculative_greedy"]

_SEQ = 0
HEAD_BATCH = 512  # rows of one decode of the head (and of the probe's target)


class _ExtBatch:
    """A llama_batch_ext holding tokens, each with its position and sequence and optionally a hidden row (copied in)."""

    def __init__(self, ctx: L.llama_context_p):
        handle = L.llama_batch_ext_init(ctx)
        if not handle:
            raise SpeculationUnavailable("llama.cpp could not make a batch for the MTP head.")
        self.handle = handle

    def fill(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        rows: np.ndarray | None,
        outputs: Sequence[bool],
        seq_ids: Sequence[int] | None = None,
    ) -> None:
        L.llama_batch_ext_clear(self.handle)
        for k, token in enumerate(tokens):
            idx = L.llama_batch_ext_add_token(self.handle, seq_ids[k] if seq_ids else _SEQ, int(token))
            if idx != k:
                raise SpeculationUnavailable(f"llama.cpp refused token {token} in a batch (error {idx}).")
            L.llama_batch_ext_set_pos(self.handle, idx, ctypes.byref(L.llama_pos(int(positions[k]))))
            if rows is not None:
                row = np.ascontiguousarray(rows[k], dtype=np.float32)
                embd = L.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.shape[0])
                if not L.llama_batch_ext_set_embd_token(self.handle, idx, embd):  # copies the row
                    raise SpeculationUnavailable("llama.cpp refused a hidden row for the MTP head.")
            if outputs[k]:
                L.llama_batch_ext_set_output_logits(self.handle, idx, True)

    def process(self, ctx: L.llama_context_p) -> None:
        rc = L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, self.handle)
        if rc != 0:
            raise SpeculationUnavailable(f"llama.cpp's decode failed (code {rc}).")

    def close(self) -> None:
        if self.handle:
            L.llama_batch_ext_free(self.handle)
            self.handle = None


def _row(ptr: ctypes._Pointer[ctypes.c_float] | None, n_embd: int) -> np.ndarray:
    if not ptr:
        raise SpeculationUnavailable("llama.cpp has no hidden row there (was the target decoded with nextn on?).")
    return np.ctypeslib.as_array(ptr, shape=(n_embd,)).copy()


def open_context(
    model: L.llama_model_p, n_ctx: int, threads: int, kind: int, n_rs_seq: int = 0, n_seq_max: int = 1
) -> L.llama_context_p:
    """A context of `kind` (default, or MTP: the head's) on a model loaded with its MTP layers."""
    cparams = L.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = HEAD_BATCH
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.n_rs_seq = n_rs_seq
    cparams.n_seq_max = n_seq_max
    cparams.kv_unified = True
    cparams.ctx_type = kind
    with _lifecycle:
        ctx: L.llama_context_p | None = L.llama_init_from_model(model, cparams)
    if not ctx:
        raise SpeculationUnavailable("llama.cpp could not open a context for MTP drafting.")
    return ctx


class MtpHead:
    """The MTP head's own context (type MTP) on a model loaded with load_mtp, for n_seq_max sequences: fed tokens,
    each with its position and the hidden row it follows, it gives logits and its own hidden row on the rows asked
    for. Its KV cache holds the head's layer only, so it rolls back any number of tokens."""

    def __init__(self, model: L.llama_model_p, n_ctx: int, threads: int, n_seq_max: int = 1):
        self.n_seq_max = n_seq_max
        self.n_embd = int(L.llama_model_n_embd(model))
        self.n_vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)))
        self.ctx: L.llama_context_p | None = open_context(model, n_ctx, threads, L.LLAMA_CONTEXT_TYPE_MTP, 0, n_seq_max)
        X.llama_set_embeddings_nextn(self.ctx, True, True)  # masked: rows of the outputs only
        self._batch = _ExtBatch(self.ctx)

    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        rows: np.ndarray,
        outputs: Sequence[bool],
        seq_ids: Sequence[int] | None = None,
    ) -> None:
        """One decode (at most HEAD_BATCH tokens): token i at positions[i] after hidden row rows[i]."""
        assert self.ctx is not None
        self._batch.fill(tokens, positions, rows, outputs, seq_ids)
        self._batch.process(self.ctx)

    def logits(self, i: int) -> np.ndarray:
        """The logits of the last decode's batch row i (an output), a view valid until the next decode."""
        logits = L.llama_get_logits_ith(self.ctx, i)
        if not logits:
            raise SpeculationUnavailable("llama.cpp has no logits for that row.")
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,))

    def hidden(self, i: int) -> np.ndarray:
        """The head's own hidden row on the last decode's batch row i (an output): what its next draft follows."""
        return _row(X.llama_get_embeddings_nextn_ith(self.ctx, i), self.n_embd)

    def forget_from(self, pos: int, seq: int = _SEQ) -> None:
        L.llama_memory_seq_rm(L.llama_get_memory(self.ctx), seq, pos, -1)

    def next_position(self, seq: int = _SEQ) -> int:
        return int(L.llama_memory_seq_pos_max(L.llama_get_memory(self.ctx), seq)) + 1

    def close(self) -> None:
        with _lifecycle:
            self._batch.close()
            if self.ctx:
                L.llama_free(self.ctx)
                self.ctx = None

    def __del__(self) -> None:
        if getattr(self, "ctx", None) and _lifecycle.acquire(blocking=False):
            try:
                self.close()
            finally:
                _lifecycle.release()


class MtpModel:
    """A model loaded with its MTP layers, a target context that emits hidden rows, and the head's context."""

    def __init__(self, path: str | Path, n_ctx: int = 4096, n_rs_seq: int = 0, threads: int | None = None):
        _init_backend()
        mparams = L.llama_model_default_params()
        mparams.load_mtp = True
        mparams.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(str(path).encode(), mparams)
        self.tgt: L.llama_context_p | None = None
        self.head: MtpHead | None = None
        if not self.model:
            raise ModelFileError(f"llama.cpp could not load {Path(path).name} with its MTP layers.")
        problem = mtp_problem(self.model, loaded_with_mtp=True)
        if problem:
            self.close()
            raise SpeculationUnavailable(f"No MTP drafting for {Path(path).name}: {problem}")
        n_threads = LoadSettings(threads=threads).resolved_threads()
        try:
            self.tgt = open_context(self.model, n_ctx, n_threads, L.LLAMA_CONTEXT_TYPE_DEFAULT, n_rs_seq)
            self.head = MtpHead(self.model, n_ctx, n_threads)
        except SpeculationUnavailable:
            self.close()
            raise
        self.n_embd, self.n_vocab = self.head.n_embd, self.head.n_vocab
        X.llama_set_embeddings_nextn(self.tgt, True, False)
        self._tgt_batch = _ExtBatch(self.tgt)
        self.pending = np.zeros(self.n_embd, dtype=np.float32)  # the hidden row the next catch-up starts with
        self.verify_rows = np.zeros((0, self.n_embd), dtype=np.float32)

    def decode_target(self, tokens: Sequence[int], pos0: int) -> np.ndarray:
        """Decode tokens at pos0.. on the target (every row's logits kept); the greedy token after each, and the
        MTP head caught up on them."""
        assert self.tgt is not None
        positions = range(pos0, pos0 + len(tokens))
        L.llama_memory_seq_rm(L.llama_get_memory(self.tgt), _SEQ, pos0, -1)
        self._tgt_batch.fill(tokens, positions, None, [True] * len(tokens))
        self._tgt_batch.process(self.tgt)
        greedy = np.array([self._argmax(self.tgt, i) for i in range(len(tokens))], dtype=np.int64)
        rows = np.stack([_row(X.llama_get_embeddings_nextn_ith(self.tgt, i), self.n_embd) for i in range(len(tokens))])
        self._catch_up(tokens, pos0, rows)
        return greedy

    def _catch_up(self, tokens: Sequence[int], pos0: int, rows: np.ndarray) -> None:
        """Token k paired with the target's row k-1 (the first with the pending row) into the head's cache."""
        assert self.head is not None
        shifted = np.concatenate([self.pending[None, :], rows[:-1]])
        self.head.forget_from(pos0)
        self.head.decode(tokens, range(pos0, pos0 + len(tokens)), shifted, [False] * len(tokens))
        self.verify_rows = rows
        self.pending = rows[-1].copy()

    def accept(self, n_accepted: int) -> None:
        """After a verify batch of 1 + drafts decoded with decode_target, n_accepted of them kept: carry row n on."""
        if len(self.verify_rows):
            self.pending = self.verify_rows[min(n_accepted, len(self.verify_rows) - 1)].copy()

    def draft(self, last: int, pos: int, n_max: int) -> list[int]:
        """Up to n_max greedy draft tokens after `last`, the token the target chose for position pos."""
        assert self.head is not None
        out: list[int] = []
        token, row = last, self.pending
        for i in range(n_max):
            self.head.forget_from(pos + i)
            self.head.decode([token], [pos + i], row[None, :], [True])
            token = int(np.argmax(self.head.logits(0)))
            row = self.head.hidden(0)
            out.append(token)
        return out

    def _argmax(self, ctx: L.llama_context_p, i: int) -> int:
        logits = L.llama_get_logits_ith(ctx, i)
        if not logits:
            raise SpeculationUnavailable("llama.cpp has no logits for that row.")
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(self.n_vocab,))))

    def close(self) -> None:
        if hasattr(self, "_tgt_batch"):
            self._tgt_batch.close()
        if self.head is not None:
            self.head.close()
        if self.tgt:
            L.llama_free(self.tgt)
        self.tgt = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> MtpModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Agreement:
    positions: int  # how many next tokens the head guessed
    agreed: int  # how many of them were the target's greedy next token
    target_tokens: list[int]  # the target's greedy answer (plain decoding, one token a step)

    @property
    def rate(self) -> float:
        return self.agreed / self.positions if self.positions else 0.0


def head_agreement(model: MtpModel, prompt: Sequence[int], n_tokens: int) -> Agreement:
    """Plain greedy decoding of n_tokens after prompt; before each target step the head guesses the token after
    the one just chosen, and is scored against what the target then picks."""
    greedy = model.decode_target(prompt, 0)
    token, pos, agreed = int(greedy[-1]), len(prompt), 0
    answer: list[int] = []
    for _ in range(n_tokens):
        [guess] = model.draft(token, pos, 1)
        answer.append(token)
        token = int(model.decode_target([token], pos)[0])
        agreed += guess == token
        pos += 1
    return Agreement(n_tokens, agreed, answer)


@dataclass(frozen=True)
class SpeculativeRun:
    drafted: int
    accepted: int
    tokens: list[int]  # the answer: with greedy verification, plain decoding's token for token

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def speculative_greedy(model: MtpModel, prompt: Sequence[int], n_tokens: int, n_draft: int = 3) -> SpeculativeRun:
    """Greedy decoding of n_tokens after prompt, n_draft tokens drafted by the head each step and verified in one
    target batch; rejected drafts are rolled back (the model needs n_rs_seq >= n_draft on a hybrid target)."""
    assert model.tgt is not None
    token, pos = int(model.decode_target(prompt, 0)[-1]), len(prompt)
    answer: list[int] = []
    drafted = accepted = 0
    while len(answer) < n_tokens:
        drafts = model.draft(token, pos, min(n_draft, n_tokens - len(answer) - 1)) if n_draft else []
        verified = model.decode_target([token, *drafts], pos)
        n = 0
        while n < len(drafts) and drafts[n] == int(verified[n]):
            n += 1
        drafted, accepted = drafted + len(drafts), accepted + n
        answer += [token, *drafts[:n]]
        model.accept(n)
        if n < len(drafts) and not L.llama_memory_seq_rm(L.llama_get_memory(model.tgt), _SEQ, pos + 1 + n, -1):
            raise SpeculationUnavailable("llama.cpp could not roll the target back (is n_rs_seq >= the draft?).")
        token, pos = int(verified[n]), pos + 1 + n
    return SpeculativeRun(drafted, accepted, answer[:n_tokens])
