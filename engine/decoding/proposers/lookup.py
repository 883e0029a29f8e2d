"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of the current suffix.

The history is the prompt plus everything generated, so answers that copy the prompt, or repeat
earlier turns of the conversation, are drafted for free. Longest n-gram first, as in vLLM's
n-gram proposer; among equal matches the most recent wins, since recent text repeats best.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ...errors import InvalidSettingError
from .base import Proposal


def find_lookup_draft(history: np.ndarray, min_n: int, max_n: int, max_tokens: int) -> np.ndarray:
    """Tokens following the latest earlier match of the longest suffix n-gram (min_n ≤ n ≤ max_n)."""
    size = len(history)
    if max_tokens <= 0:
        return history[:0]
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = history[size - n:]
        # Windows starting at 0..size-n-1: every earlier n-gram, excluding the suffix itself.
        windows = sliding_window_view(history[: size - 1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if len(starts):
            begin = int(starts[-1]) + n
            return history[begin: begin + max_tokens]
    return history[:0]


class LookupProposer:
    name = "lookup"
    free = True

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4):
        if not (1 <= min_ngram <= max_ngram <= 16):
            raise InvalidSettingError(f"n-gram range must satisfy 1 ≤ min ≤ max ≤ 16, got {min_ngram}..{max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram

    def begin(self, prompt: Sequence[int], sampling, device, seed: int) -> None:
        pass

    def propose(self, history: Sequence[int], max_tokens: int) -> Proposal:
        tokens = np.asarray(history, dtype=np.int64)
        draft = find_lookup_draft(tokens, self.min_ngram, self.max_ngram, max_tokens)
        return Proposal(tokens=draft.tolist())

    def feedback(self, drafted: int, accepted: int) -> None:
        pass
