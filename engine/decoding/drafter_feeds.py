"""What a target keeps for the drafters built on it (runtime.Model mixes this in): the MTP head's hidden rows
(hidden_rows.py) and an EAGLE-3 head's layer inputs (layer_inputs.py), by sequence and position as its KV cache holds
them; the contexts that run on its weights (an MTP head's) or borrow its context (an EAGLE-3 head's), closed before
what they use is; and a draft head's own weights, which open no context of their own."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import llama_cpp as L
import numpy as np
from llama_cpp import llama_cpp_ext as X

from ..hardware import backend_name
from .hidden_rows import HiddenRows
from .layer_inputs import LayerInputs

if TYPE_CHECKING:
    from .runtime import LoadSettings


class SupportsClose(Protocol):
    def close(self) -> None: ...


_Closable = TypeVar("_Closable", bound=SupportsClose)


class DrafterFeeds:
    _model: L.llama_model_p | None
    _ctx: L.llama_context_p | None
    hidden: HiddenRows | None  # the hidden rows of every decode, where an MTP head reads them
    layer_inputs: LayerInputs | None  # some layers' inputs of every decode (an EAGLE-3 head's food)
    n_embd_out: int
    _attached: weakref.WeakSet[Any]  # contexts on these weights (an MTP head's)
    _context_users: weakref.WeakSet[Any]  # contexts borrowing this one (EAGLE-3 heads')
    n_ctx: int
    n_batch: int
    threads: int
    backend: str
    rollback_room: dict[int, int]
    max_rollback: int | None
    mtp_problem: str | None

    @property
    def n_layer(self) -> int:
        """Its layers as its graph runs them (MTP layers aside)."""
        return int(L.llama_model_n_layer(self._model))

    @property
    def n_embd(self) -> int:
        """The width of its hidden states."""
        return int(L.llama_model_n_embd(self._model))

    def _open_head(self, settings: LoadSettings) -> None:
        """A draft head's weights without a context: its proposer opens one beside the target's."""
        train_ctx = L.llama_model_n_ctx_train(self._model)
        self.n_ctx = min(settings.n_ctx or train_ctx, train_ctx)
        self.n_batch = settings.n_batch
        self.threads = settings.resolved_threads()
        self.backend = backend_name() if settings.n_gpu_layers != 0 else "CPU"
        self.rollback_room = {}
        self.max_rollback = None
        self.mtp_problem = "it is a draft head, not a model."

    def open_attached(self, opener: Callable[[L.llama_model_p], _Closable]) -> _Closable:
        """A context of another kind on this model's weights (the MTP head's), opened by opener(weights); it is
        closed before the weights are freed."""
        assert self._model is not None  # an open model
        context = opener(self._model)
        self._attached.add(context)
        return context

    def keep_layer_inputs(self, layers: Sequence[int]) -> LayerInputs:
        """From the next decode on, keep these layers' inputs of every token (layer_inputs.py checks first that
        llama.cpp can give them: it aborts where it cannot)."""
        assert self._ctx is not None  # a target with a context
        if self.layer_inputs is None or self.layer_inputs.layers != list(layers):
            self.layer_inputs = LayerInputs(layers, self.n_embd)
            self.layer_inputs.switch_on(self._ctx)
        return self.layer_inputs

    def borrow_context(self, opener: Callable[[L.llama_context_p], _Closable]) -> _Closable:
        """A context that borrows this one (an EAGLE-3 head's, ctx_other), opened by opener(context); it is closed
        before this context is (a reopen, a close): its owner opens it again when it finds it closed."""
        assert self._ctx is not None
        context = opener(self._ctx)
        self._context_users.add(context)
        return context

    # --- kept as the KV cache is ----------------------------------------------------------------
    def _keep_feeds(self, n: int, positions: Sequence[int] | np.ndarray, seq_ids: Sequence[int]) -> None:
        """The last decode's rows that the drafters read, kept by sequence and position."""
        if self.hidden is not None:
            ptr = X.llama_get_embeddings_nextn(self._ctx)
            if ptr:
                self.hidden.record(positions, seq_ids, np.ctypeslib.as_array(ptr, shape=(n, self.n_embd_out)))
        if self.layer_inputs is not None and self._ctx:
            self.layer_inputs.record(self._ctx, positions, seq_ids)

    def _forget_feeds(self, pos: int, seq_id: int) -> None:
        if self.hidden is not None:
            self.hidden.forget_from(pos, seq_id)
        if self.layer_inputs is not None:
            self.layer_inputs.rows.forget_from(pos, seq_id)

    def _share_feeds(self, source: int, seq_id: int, n: int) -> None:
        if self.hidden is not None:
            self.hidden.share(source, seq_id, n)
        if self.layer_inputs is not None:
            self.layer_inputs.rows.share(source, seq_id, n)

    def _forget_all_feeds(self) -> None:
        if self.hidden is not None:
            self.hidden.forget_all()
        if self.layer_inputs is not None:
            self.layer_inputs.rows.forget_all()

    # --- closing ------------------------------------------------------------------------------
    def _close_borrowers(self) -> None:
        for user in list(self._context_users):
            user.close()

    def _close_attached(self) -> None:
        for context in list(self._attached):
            context.close()
