"""An EAGLE-3 draft head's own context, driven as common/speculative.cpp's draft-eagle3 drives it in the pinned
llama.cpp (llama-cpp-python 0.3.36; ../shared/DESIGN.md, "Built-in drafters").

The head is a GGUF of its own (architecture eagle3): an encoder (`fc`) fuses the inputs of three of the target's
layers at a position P into one row g_P, and a one-layer decoder with a KV cache of its own is fed, at position P,
the token of P+1 with g_P; its logits guess the token after, and its pre-norm row is the g it is fed with its own
draft at P+1. A head without a token embedding or output matrix of its own borrows the target's: its context is
opened with `ctx_other` pointing at the target's context, so it must be reopened when that context is.

Both steps go through llama_process: ENCODE with embedding rows (g read back from the nextn embeddings, masked to
the rows asked for), DECODE with tokens each carrying its g row.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp as L
import numpy as np
from llama_cpp import llama_cpp_ext as X

from ..errors import SpeculationUnavailable
from .mtp_head import HEAD_BATCH, HeadContext
from .runtime import _lifecycle


def open_head_context(
    head: L.llama_model_p, target_ctx: L.llama_context_p, n_ctx: int, threads: int, n_seq_max: int
) -> L.llama_context_p:
    cparams = L.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = HEAD_BATCH
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.n_seq_max = n_seq_max
    cparams.kv_unified = True
    cparams.ctx_other = target_ctx  # the target's token embedding and output matrix, where the head has none
    with _lifecycle:
        ctx: L.llama_context_p | None = L.llama_init_from_model(head, cparams)
    if not ctx:
        raise SpeculationUnavailable("llama.cpp could not open a context for the EAGLE-3 head.")
    return ctx


class Eagle3Head(HeadContext):
    """The head's context for n_seq_max sequences: encode() turns the target's fused layer inputs into g rows,
    decode() feeds tokens with their g rows; logits() and hidden() read the rows asked for (hidden: the pre-norm row,
    the g its next draft is fed)."""

    def __init__(
        self, head: L.llama_model_p, target_ctx: L.llama_context_p, n_ctx: int, threads: int, n_seq_max: int = 1
    ):
        super().__init__(head, open_head_context(head, target_ctx, n_ctx, threads, n_seq_max), n_seq_max)
        self.target_ctx = target_ctx  # the context it borrows from: a reopened target needs a new head context

    def encode(self, features: np.ndarray) -> np.ndarray:
        """g rows (n x n_embd) of fused target features (n x 3 * the target's width), HEAD_BATCH rows at a time."""
        assert self.ctx is not None
        out = np.empty((len(features), self.n_embd), dtype=np.float32)
        features = np.ascontiguousarray(features, dtype=np.float32)
        for begin in range(0, len(features), HEAD_BATCH):
            part = features[begin : begin + HEAD_BATCH]
            handle = self._batch.handle
            L.llama_batch_ext_clear(handle)
            # the encoder reads no position, but llama.cpp wants them to follow on from sequence 0's cache
            start = self.next_position(0)
            for k, row in enumerate(part):
                embd = L.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.shape[0])
                idx = L.llama_batch_ext_add_embd(handle, 0, embd)  # copied: the row need not outlive the call
                if idx != k:
                    raise SpeculationUnavailable(f"llama.cpp refused a feature row for the EAGLE-3 head ({idx}).")
                L.llama_batch_ext_set_pos(handle, idx, ctypes.byref(L.llama_pos(start + k)))
                L.llama_batch_ext_set_output_logits(handle, idx, True)
            rc = L.llama_process(self.ctx, L.LLAMA_PROCESS_TYPE_ENCODE, handle)
            if rc != 0:
                raise SpeculationUnavailable(f"llama.cpp's EAGLE-3 encode failed (code {rc}).")
            g = X.llama_get_embeddings_nextn(self.ctx)
            if not g:
                raise SpeculationUnavailable("llama.cpp's EAGLE-3 encoder gave no rows.")
            out[begin : begin + len(part)] = np.ctypeslib.as_array(g, shape=(len(part), self.n_embd))
        return out

    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        rows: np.ndarray,
        outputs: Sequence[bool],
        seq_ids: Sequence[int] | None = None,
    ) -> None:
        """One decode (at most HEAD_BATCH tokens): token i at positions[i] with g row rows[i]. A decode that wants
        any output gets every row's: llama.cpp's eagle3 graph does not pick the rows asked for, so it hands back its
        first rows instead (with only the last of 3 rows asked for, logits(2) was row 0's)."""
        assert self.ctx is not None
        if any(outputs):
            outputs = [True] * len(tokens)
        self._batch.fill(tokens, positions, rows, outputs, seq_ids)
        self._batch.process(self.ctx)
