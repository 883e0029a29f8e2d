"""A model's own MTP ("nextn") head driven through llama.cpp's graphs, as common/speculative.cpp's draft-mtp does in
the pinned llama.cpp (llama-cpp-python 0.3.36): the head's own context, which proposers/mtp.py drafts with inside
the step loop (the one draft-mtp loop: catch-up, draft, accept).

The protocol (../shared/DESIGN.md, "Built-in drafters"): the model is loaded once with `load_mtp`; the target
context emits its hidden states (`set_embeddings_nextn(tgt, true, false)`: one row per token decoded, runtime.py);
a second context on the same model, of type MTP, runs the head (MtpHead). Each decoded token k is fed to the head
paired with the target's hidden row of token k-1; a draft feeds (token, position, the head's own hidden row) back
in. On n accepted drafts the row carried on is the verify batch's row n.

llama.cpp aborts the process (GGML_ASSERT, no exception) on an MTP context of a model loaded without `load_mtp`,
and on a qwen35 / glm4-moe head count other than one: the target's Model refuses those first (mtp_check.py), and
every hidden row is read through a null-checked pointer (llama.cpp returns NULL for an id it cannot serve).
This API is marked work in progress upstream: it is pinned to llama-cpp-python 0.3.36.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp as L
import numpy as np
from llama_cpp import llama_cpp_ext as X

from ..errors import SpeculationUnavailable
from .runtime import _lifecycle

__all__ = ["HEAD_BATCH", "MtpHead"]

_SEQ = 0
HEAD_BATCH = 512  # rows of one decode of the head


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


def _open_head_context(model: L.llama_model_p, n_ctx: int, threads: int, n_seq_max: int) -> L.llama_context_p:
    """A context of type MTP (the head's) on a model loaded with its MTP layers."""
    cparams = L.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = HEAD_BATCH
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.n_seq_max = n_seq_max
    cparams.kv_unified = True
    cparams.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
    with _lifecycle:
        ctx: L.llama_context_p | None = L.llama_init_from_model(model, cparams)
    if not ctx:
        raise SpeculationUnavailable("llama.cpp could not open a context for MTP drafting.")
    return ctx


class HeadContext:
    """A drafting head's own context (an MTP head's, an EAGLE-3 head's) for n_seq_max sequences, opened by the
    subclass: fed tokens, each with its position and the row it follows, it gives logits and its own row on the rows
    asked for (nextn embeddings, masked to those rows)."""

    def __init__(self, model: L.llama_model_p, ctx: L.llama_context_p, n_seq_max: int):
        self.n_seq_max = n_seq_max
        self.n_embd = int(L.llama_model_n_embd(model))
        self.n_vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)))
        self.ctx: L.llama_context_p | None = ctx
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
        """One decode (at most HEAD_BATCH tokens): token i at positions[i] after row rows[i]."""
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
        """The head's own row on the last decode's batch row i (an output): what its next draft is fed."""
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


class MtpHead(HeadContext):
    """The MTP head's own context (type MTP) on a model loaded with load_mtp. Its KV cache holds the head's layer
    only, so it rolls back any number of tokens."""

    def __init__(self, model: L.llama_model_p, n_ctx: int, threads: int, n_seq_max: int = 1):
        super().__init__(model, _open_head_context(model, n_ctx, threads, n_seq_max), n_seq_max)
