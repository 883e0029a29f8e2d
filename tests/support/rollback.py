"""A broken roll-back, to show a test can see one: Model.forget_from that cuts the KV cache back as usual but leaves
a hybrid model's recurrent state holding what it cut (llama.cpp's partial sequence state, the recurrent part only,
saved before and written back after)."""

from __future__ import annotations

import ctypes

import llama_cpp as L
import pytest

from engine.decoding.runtime import Model

_PARTIAL = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # a hybrid model's recurrent state, without its attention KV


def keep_recurrent_state_on_rollback(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Model.forget_from

    def forget_from(self: Model, pos: int, seq_id: int = 0) -> None:
        ctx = self._ctx
        size = L.llama_state_seq_get_size_ext(ctx, seq_id, _PARTIAL)
        saved = (ctypes.c_uint8 * size)()
        assert L.llama_state_seq_get_data_ext(ctx, saved, size, seq_id, _PARTIAL) == size
        real(self, pos, seq_id)
        if pos > 0:  # a roll-back, not a new request's clear
            assert L.llama_state_seq_set_data_ext(ctx, saved, size, seq_id, _PARTIAL) == size

    monkeypatch.setattr(Model, "forget_from", forget_from)
