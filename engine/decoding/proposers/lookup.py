"""Prompt lookup: draft the tokens that followed the longest earlier match of the history's end.

The history is the prompt plus everything generated, so answers that copy the prompt, or repeat
earlier turns of the conversation, are drafted for free. The longest match wins (the most recent
among equals, since recent text repeats best), and its length travels with the draft: the cost model
learns how often a match of that length continues correctly, so a long match drafts long at once and
a one-token coincidence is not trusted. Beyond the current history it also looks in earlier requests'
histories of the same model (SuffixDecoding's idea, arXiv 2411.04975, kept simple: longest match).
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from ...errors import InvalidSettingError
from .base import Proposal, Want

MAX_NGRAM = 32
EARLIER_TOKENS = 200_000  # earlier histories kept for lookup, oldest dropped first
EARLIER_MIN_TOKENS = 16  # shorter histories teach nothing worth keeping
_GAP = -1  # between earlier histories: no match or continuation runs across it


def longest_match(corpus: np.ndarray, query: np.ndarray, end: int, min_n: int, max_n: int) -> tuple[int, int]:
    """(start of the continuation, match length) for the longest n ≤ max_n such that the last n tokens
    of query equal corpus[i-n+1..i] for some i < end; the latest such i wins. (0, 0) when n < min_n."""
    if len(query) == 0 or end <= 0:
        return 0, 0
    candidates = np.flatnonzero(corpus[:end] == query[-1])
    n = 1
    while len(candidates) and n < min(max_n, len(query)):
        before = candidates - n
        candidates_ok = candidates[before >= 0]
        extended = candidates_ok[corpus[before[before >= 0]] == query[-1 - n]]
        if not len(extended):
            break
        candidates, n = extended, n + 1
    if not len(candidates) or n < min_n:
        return 0, 0
    return int(candidates[-1]) + 1, n


def find_lookup_draft(history: np.ndarray, min_n: int, max_n: int, max_tokens: int) -> tuple[np.ndarray, int]:
    """Tokens following the latest earlier match of the longest suffix n-gram, and n."""
    if max_tokens <= 0:
        return history[:0], 0
    begin, n = longest_match(history, history, len(history) - 1, min_n, max_n)
    return (history[begin:begin + max_tokens], n) if n else (history[:0], 0)


class LookupProposer:
    name = "lookup"
    free = True

    def __init__(self, min_ngram: int = 1, max_ngram: int = 16, remember_requests: bool = True):
        if not (1 <= min_ngram <= max_ngram <= MAX_NGRAM):
            raise InvalidSettingError(
                f"n-gram range must satisfy 1 ≤ min ≤ max ≤ {MAX_NGRAM}, got {min_ngram}..{max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.remember_requests = remember_requests
        self._earlier: deque[np.ndarray] = deque()
        self._earlier_corpus: np.ndarray | None = None  # the deque joined with gaps, built when needed

    def start(self, slot, prompt, sampling, device, seed) -> None:
        pass

    def propose(self, wants: list[Want]) -> list[Proposal]:
        return [self.propose_one(history, k) for _, history, k in wants]

    def propose_one(self, history: Sequence[int], max_tokens: int) -> Proposal:
        tokens = np.asarray(history, dtype=np.int64)
        draft, n = find_lookup_draft(tokens, self.min_ngram, self.max_ngram, max_tokens)
        if n < self.max_ngram and self._earlier and max_tokens > 0:
            corpus = self._corpus()
            begin, m = longest_match(corpus, tokens[-self.max_ngram:], len(corpus) - 1, max(self.min_ngram, n + 1),
                                     self.max_ngram)
            if m > n:  # a longer match in an earlier request: its continuation, up to the gap
                tail = corpus[begin:begin + max_tokens]
                gaps = np.flatnonzero(tail == _GAP)
                draft, n = (tail[:gaps[0]] if len(gaps) else tail), m
        return Proposal(tokens=draft.tolist(), match_length=n if len(draft) else 0)

    def finish(self, slot: int, history: Sequence[int]) -> None:
        """Keep a finished request's history for later lookups (the chat's next turn has it anyway, but
        a new conversation, a regenerated answer or another client's request does not)."""
        if not self.remember_requests or len(history) < EARLIER_MIN_TOKENS:
            return
        self._earlier.append(np.asarray(history, dtype=np.int64))
        while sum(len(h) + 1 for h in self._earlier) > EARLIER_TOKENS:
            self._earlier.popleft()
        self._earlier_corpus = None

    def _corpus(self) -> np.ndarray:
        if self._earlier_corpus is None:
            parts = []
            for h in self._earlier:
                parts += [h, np.array([_GAP], dtype=np.int64)]
            self._earlier_corpus = np.concatenate(parts)
        return self._earlier_corpus
