"""Prompt lookup: draft the tokens that followed the longest earlier match of the history's end.

The history is the prompt plus everything generated, so answers that copy the prompt, or repeat
earlier turns of the conversation, are drafted for free. The longest match wins (the most recent
among equals, since recent text repeats best), and its length travels with the draft: the cost model
learns how often a match of that length continues correctly, so a long match drafts long at once and
a one-token coincidence is not trusted. A line written again and again is drafted on with its period,
and an edit the answer keeps making to what it copies (Edits) is written into the drafts that follow.
Beyond the current history it also looks in earlier requests' histories of the same model
(SuffixDecoding's idea, arXiv 2411.04975, kept simple: longest match).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...errors import InvalidSettingError
from .base import Ingredients, Proposal, Want

if TYPE_CHECKING:
    import torch

    from ..sampling import SamplingParams

MAX_NGRAM = 32
EARLIER_TOKENS = 200_000  # earlier histories kept for lookup, oldest dropped first
EARLIER_MIN_TOKENS = 16  # shorter histories teach nothing worth keeping
_GAP = -1  # between earlier histories: no match or continuation runs across it
# An edit counts once the answer, after writing another token for one of the draft's, goes on as the draft
# did for this many tokens ("Reading the input" written as "Writing the report" is not an edit of "Reading").
EDIT_CONFIRMATION = 2
# longest_match extends candidate matches a token at a time (numpy calls each round, ~3 µs); once a match is this
# long and the candidates this few (a copy), it compares the rest of the lengths at once: 48 µs a step -> 18.
LONG_MATCH, FEW_CANDIDATES = 4, 8
# Up to this many earlier occurrences of the last token, self_match compares them in Python (a list index costs
# ~30 ns; each numpy call ~3 µs warm and ~25 µs right after a decode). Live, SmolLM2's open answers: the match
# alone took 84 µs a step; now the match and its draft take 30-40 µs, 77 µs with the history's upkeep.
FEW_CANDIDATES_FOR_PYTHON = 24
PERIOD_EVIDENCE = 8  # matched tokens that show a long period has repeated (see continuation())
# Matches are measured up to this many tokens. At 16 the cost model's features for 24- and 32-token matches never
# occurred, so a copy 16 tokens in and one 100 tokens in shared one acceptance estimate; at 24 deep copies learn
# their own and draft longer. Replayed (tuning sets, 24 answers, the planner calibrated on each of three curves and
# charged their median): geomean 1.569 / 1.527 / 1.615 -> 1.569 / 1.571 / 1.614; held-out 1.421 / 1.407 / 1.452 ->
# 1.422 / 1.410 / 1.458.
DEFAULT_MAX_NGRAM = 24


def longest_match(corpus: np.ndarray, query: np.ndarray, end: int, min_n: int, max_n: int) -> tuple[int, int]:
    """(start of the continuation, match length) for the longest n ≤ max_n such that the last n tokens
    of query equal corpus[i-n+1..i] for some i < end; the latest such i wins. (0, 0) when n < min_n."""
    if len(query) == 0 or end <= 0:
        return 0, 0
    ends = np.flatnonzero(corpus[:end] == query[-1])  # where a match of length n can end
    n, width, backwards = 1, min(max_n, len(query)), query[::-1]
    while len(ends) and n < width:
        if n >= LONG_MATCH and len(ends) <= FEW_CANDIDATES:  # a copy: compare the rest of the lengths at once
            back = ends[:, None] - np.arange(n, width)
            longer = ((corpus[np.maximum(back, 0)] == backwards[n:width]) & (back >= 0)).cumprod(axis=1).sum(axis=1)
            best = longer.max()
            return int(ends[np.flatnonzero(longer == best)[-1]]) + 1, n + int(best)
        before = ends - n
        extended = ends[(before >= 0) & (corpus[np.maximum(before, 0)] == backwards[n])]
        if not len(extended):
            break
        ends, n = extended, n + 1
    if not len(ends) or n < min_n:
        return 0, 0
    return int(ends[-1]) + 1, n


def find_lookup_draft(history: np.ndarray, min_n: int, max_n: int, max_tokens: int) -> tuple[np.ndarray, int]:
    """Tokens following the latest earlier match of the longest suffix n-gram, and n."""
    if max_tokens <= 0:
        return history[:0], 0
    begin, n = longest_match(history, history, len(history) - 1, min_n, max_n)
    return (continuation(history, begin, n, max_tokens), n) if n else (history[:0], 0)


def continuation(history: np.ndarray, begin: int, matched: int, max_tokens: int) -> np.ndarray:
    """history[begin:begin + max_tokens]. One that runs into the end of the history goes on with its period
    when the match spans a whole period, or PERIOD_EVIDENCE tokens of a long one (the text has repeated: a
    line written again and again), as the repetition would."""
    draft = history[begin : begin + max_tokens]
    if len(draft) < max_tokens and matched >= min(len(history) - begin, PERIOD_EVIDENCE):
        return np.resize(draft, max_tokens)  # np.resize repeats cyclically
    return draft


class HistoryArray:
    """A sequence's history (a list that only grows) as a numpy array that grows with it: converting the whole
    list every step cost ~20 µs at 2,000 tokens. Another list, or a shorter one, is converted afresh. It also
    keeps where each token occurs, so the history's own longest match (self_match) starts from its few
    candidates instead of a pass over the whole history and a numpy round per matched token."""

    def __init__(self) -> None:
        self._buffer = np.empty(0, dtype=np.int64)
        self._source: Sequence[int] | None = None
        self._length = 0
        self._where: dict[int, list[int]] = {}  # token -> its positions, ascending

    def of(self, history: Sequence[int]) -> np.ndarray:
        n, seen = len(history), self._length
        if history is not self._source or n < seen:
            self._source, seen, self._where = history, 0, {}
        if n > len(self._buffer):
            grown = np.empty(max(n, 2 * len(self._buffer), 256), dtype=np.int64)
            grown[:seen] = self._buffer[:seen]
            self._buffer = grown
        self._buffer[seen:n] = history[seen:n]
        where = self._where
        for i in range(seen, n):
            where.setdefault(history[i], []).append(i)
        self._length = n
        return self._buffer[:n]

    def self_match(self, min_n: int, max_n: int) -> tuple[int, int]:
        """longest_match(h, h, len(h) - 1, min_n, max_n) for the history h last given to of()."""
        h, n = self._source, self._length
        if not n:
            return 0, 0
        assert h is not None  # of() set it with the length
        ends = self._where[h[n - 1]]
        if len(ends) > FEW_CANDIDATES_FOR_PYTHON:  # a common token: numpy compares them all at once
            array = self._buffer[:n]
            return longest_match(array, array, n - 1, min_n, max_n)
        width, best_n, best_end = min(max_n, n), 0, 0
        for end in ends[:-1]:  # the last is the history's own end
            m = 1
            while m < width and m <= end and h[end - m] == h[n - 1 - m]:
                m += 1
            if m >= best_n:  # the latest wins among equals
                best_n, best_end = m, end
        return (best_end + 1, best_n) if best_n >= min_n else (0, 0)


@dataclass
class Edits:
    """What one answer changes while it copies: a source token it writes as another one each time (`var` as
    `const`, `print "` as `print("`, a renamed key). Learned from its own drafts: where the answer left the
    draft for one token and then went on as the draft did, that token was replaced, not the text left. Then
    its text is matched with those edits undone, and drafts copied from the source are written with them."""

    prompt_length: int = 0  # edits are learned where the answer copies its prompt, not its own earlier text
    subs: dict[int, int] = field(default_factory=dict)  # source token -> the token the answer writes instead
    source: list[int] = field(default_factory=list)  # the last draft as found in the history ...
    draft: list[int] = field(default_factory=list)  # ... and as proposed, edits applied
    source_at: int = 0  # where in the history its source starts
    made_at: int = 0  # the history's length when it was made
    pending: list[tuple[int, int, list[int]]] = field(default_factory=list)  # (source, written, still expected)

    def propose(
        self, history: np.ndarray, min_n: int, max_n: int, max_tokens: int, index: HistoryArray | None = None
    ) -> tuple[np.ndarray, int]:
        """The plain lookup draft, or the one found with this answer's edits undone where that match is longer
        (then written with the edits). index: the HistoryArray that made history, if one did."""
        self._learn(history)
        begin, n = (
            index.self_match(min_n, max_n)
            if index is not None
            else longest_match(history, history, len(history) - 1, min_n, max_n)
        )
        edited = False
        if self.subs:
            undone = history[-max_n - 1 :].copy()
            for x, y in self.subs.items():
                undone[history[-max_n - 1 :] == y] = x
            begin_e, m = longest_match(history, undone, len(history) - 1, min_n, max_n)
            if m > n:
                begin, n, edited = begin_e, m, True
        source = continuation(history, begin, n, max_tokens) if n and max_tokens > 0 else history[:0]
        draft = np.asarray([self.subs.get(int(t), int(t)) for t in source], dtype=np.int64) if edited else source
        self.source, self.draft, self.source_at, self.made_at = source.tolist(), draft.tolist(), begin, len(history)
        return draft, n if len(draft) else 0

    def _learn(self, history: np.ndarray) -> None:
        """Compare the last draft with what was written since."""
        new = history[self.made_at : self.made_at + len(self.draft) + 1].tolist()
        if new:
            waiting, self.pending = self.pending, []
            for x, y, expected in waiting:
                self._check(x, y, expected, new[: len(expected)])
        j = next((i for i, (d, t) in enumerate(zip(self.draft, new)) if d != t), None)
        if j is None:
            return
        x, y = self.source[j], new[j]
        if self.draft[j] != x:  # an edit the answer did not make here: a coincidence, not an edit
            self.subs.pop(x, None)
        if j + EDIT_CONFIRMATION < len(self.draft) and self.source_at + j < self.prompt_length:
            self._check(x, y, self.draft[j + 1 : j + 1 + EDIT_CONFIRMATION], new[j + 1 : j + 1 + EDIT_CONFIRMATION])

    def _check(self, x: int, y: int, expected: list[int], written: list[int]) -> None:
        """x was written as y; is what followed it the draft's continuation?"""
        if written != expected[: len(written)]:
            return
        if len(written) < len(expected):  # the step ended inside the check: finish it after the next one
            self.pending.append((x, y, expected[len(written) :]))
        elif x == y:
            self.subs.pop(x, None)
        else:
            self.subs[x] = y


class LookupProposer:
    name = "lookup"
    free = True
    alternatives = ()

    def __init__(self, min_ngram: int = 1, max_ngram: int = DEFAULT_MAX_NGRAM, remember_requests: bool = True):
        if not (1 <= min_ngram <= max_ngram <= MAX_NGRAM):
            raise InvalidSettingError(
                f"n-gram range must satisfy 1 ≤ min ≤ max ≤ {MAX_NGRAM}, got {min_ngram}..{max_ngram}"
            )
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.remember_requests = remember_requests
        self._earlier: deque[np.ndarray] = deque()
        self._earlier_corpus: np.ndarray | None = None  # the deque joined with gaps, built when needed
        self._edits: dict[int, Edits] = {}  # per sequence id
        self._arrays: dict[int, HistoryArray] = {}  # per sequence id

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        self._edits[slot] = Edits(len(prompt))  # a new answer makes its own edits
        self._arrays[slot] = HistoryArray()

    def propose(self, wants: list[Want]) -> list[Proposal]:
        out = []
        for slot, history, k in wants:
            index = self._arrays.setdefault(slot, HistoryArray())
            out.append(self.propose_one(index.of(history), k, self._edits.setdefault(slot, Edits()), index))
        return out

    def propose_one(
        self,
        history: Sequence[int] | np.ndarray,
        max_tokens: int,
        edits: Edits | None = None,
        index: HistoryArray | None = None,
    ) -> Proposal:
        tokens = np.asarray(history, dtype=np.int64)  # no copy when it is one already (propose's are)
        if edits is not None:
            draft, n = edits.propose(tokens, self.min_ngram, self.max_ngram, max_tokens, index)
        else:
            draft, n = find_lookup_draft(tokens, self.min_ngram, self.max_ngram, max_tokens)
        if n < self.max_ngram and self._earlier and max_tokens > 0:
            corpus = self._corpus()
            begin, m = longest_match(
                corpus, tokens[-self.max_ngram :], len(corpus) - 1, max(self.min_ngram, n + 1), self.max_ngram
            )
            if m > n:  # a longer match in an earlier request: its continuation, up to the gap
                tail = corpus[begin : begin + max_tokens]
                gaps = np.flatnonzero(tail == _GAP)
                draft, n = (tail[: gaps[0]] if len(gaps) else tail), m
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


def build(ingredients: Ingredients) -> LookupProposer:
    i = ingredients
    return LookupProposer(i.min_ngram, DEFAULT_MAX_NGRAM if i.max_ngram is None else i.max_ngram, i.remember_requests)
