"""Predicted Outputs (OpenAI's `prediction`): a request brings its own guess at the answer (a file to rewrite with
a small edit), and this free proposer drafts along that guess's tokens.

It keeps, per sequence, where in the prediction the answer is expected to go on (the cursor). While the answer
writes what the prediction says, the cursor moves along and the draft is the prediction from there. Where the answer
departs from it (a renamed word, a line added or left out), the answer's last tokens are looked up in the
prediction, as llama.cpp's n-gram lookups and vLLM's prompt lookup do, and drafting resumes after the longest
match: the nearest one from where the answer last stood, so a line that recurs in a file does not send the draft
back to an earlier copy of it (one before is taken only on a clearly longer match: the answer did go back). A token
written in place of the predicted one, where nothing longer matches, is taken for a replacement (a renamed word):
the draft goes on with what followed the predicted token, so a rename costs one step, not two.

The step loop's planning (drafting.py's FreeDrafting) asks it before the method's own free proposer (lookup) and
cuts its proposal to the plan like lookup's, with its own acceptance features. A draft is point-mass like a
lookup copy, so verification keeps the answer the target's own: greedy as without a prediction, sampled from
the target's distribution (and per seed the same tokens, the verifier's noise being fixed by position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .base import PREDICTION_SOURCE, Proposal, Want
from .lookup import MAX_NGRAM

# A match ending before the cursor (an earlier copy of the same tokens) wins over the nearest one at or after it
# only when it is this many tokens longer: in a file, short runs (": string", " = ") recur on every line, and
# jumping back on one drafts the line already written.
BACKWARD_MARGIN = 4
CONFIRMED = 2  # tokens in a row that place the answer in the prediction (one alone recurs too often to trust)


@dataclass
class _Alignment:
    """One sequence's prediction and where its answer stands in it."""

    prediction: np.ndarray
    prompt_length: int  # the history's answer starts here
    cursor: int = 0  # the prediction's index the answer is expected to write next
    run: int = 0  # answer tokens, up to the newest, that follow the prediction up to the cursor
    seen: int = 0  # answer tokens aligned so far
    # Where the answer was last known to stand (CONFIRMED tokens in a row followed the prediction there): a search
    # starts from here, so a one-token match far ahead (a word that recurs at the file's end) does not lose the place.
    anchor: int = 0
    guessed: bool = False  # the cursor skipped a token the answer replaced, on trust (see _realign)


def suffix_match(prediction: np.ndarray, tail: Sequence[int], low: int, high: int, earliest: bool) -> tuple[int, int]:
    """(end, n) for the longest n ≤ MAX_NGRAM such that tail[-n:] equals prediction[end - n + 1 : end + 1] for
    some end in [low, high); among those ends the earliest (or the latest). (0, 0) when none matches."""
    if high <= low or not len(tail):
        return 0, 0
    ends = np.flatnonzero(prediction[low:high] == tail[-1]) + low
    n, width = 1, min(MAX_NGRAM, len(tail))
    while len(ends) and n < width:
        before = ends - n
        extended = ends[(before >= 0) & (prediction[np.maximum(before, 0)] == tail[-1 - n])]
        if not len(extended):
            break
        ends, n = extended, n + 1
    if not len(ends):
        return 0, 0
    return int(ends[0] if earliest else ends[-1]), n


class PredictionProposer:
    """Drafts along each sequence's prediction, for the sequences given one (start with tokens)."""

    name = "prediction"
    free = True
    alternatives = ()

    def __init__(self) -> None:
        self._aligned: dict[int, _Alignment] = {}  # per sequence id, only those with a prediction

    def __bool__(self) -> bool:
        """Whether any sequence has a prediction (the planning asks nothing of it otherwise)."""
        return bool(self._aligned)

    def start(self, slot: int, prompt_length: int, prediction: Sequence[int]) -> None:
        """Sequence `slot` starts a request whose answer follows a prompt of `prompt_length` tokens, predicted as
        these tokens (none: no prediction, and nothing is drafted for it)."""
        if len(prediction):
            self._aligned[slot] = _Alignment(np.asarray(prediction, dtype=np.int64), prompt_length)
        else:
            self._aligned.pop(slot, None)

    def has(self, slot: int) -> bool:
        return slot in self._aligned

    def propose(self, wants: list[Want]) -> list[Proposal]:
        return [self.propose_one(slot, history, k) for slot, history, k in wants]

    def propose_one(self, slot: int, history: Sequence[int], max_tokens: int) -> Proposal:
        a = self._aligned.get(slot)
        if a is None or max_tokens <= 0:
            return Proposal(source=PREDICTION_SOURCE)
        self._follow(a, history)
        if not a.run:
            return Proposal(source=PREDICTION_SOURCE)
        draft = a.prediction[a.cursor : a.cursor + max_tokens].tolist()
        return Proposal(draft, match_length=min(a.run, MAX_NGRAM) if draft else 0, source=PREDICTION_SOURCE)

    def finish(self, slot: int, history: Sequence[int] = ()) -> None:
        self._aligned.pop(slot, None)

    def _follow(self, a: _Alignment, history: Sequence[int]) -> None:
        """Move the cursor over the answer's tokens since the last proposal; where they depart from the prediction,
        re-align on the answer's last tokens."""
        answer_length = len(history) - a.prompt_length
        prediction, departed_at = a.prediction, None
        for i in range(a.prompt_length + a.seen, len(history)):
            if a.cursor < len(prediction) and prediction[a.cursor] == history[i]:
                a.cursor, a.run, a.guessed = a.cursor + 1, a.run + 1, False
                if a.run >= CONFIRMED:
                    a.anchor = a.cursor
            else:
                departed_at = i
                break
        a.seen = answer_length
        if departed_at is not None:
            # One token written for the predicted one, on the prediction until then: a renamed word, likely.
            replaced = departed_at == len(history) - 1 and a.run > 0 and not a.guessed
            self._realign(a, history[len(history) - min(answer_length, MAX_NGRAM) :], replaced)

    def _realign(self, a: _Alignment, tail: Sequence[int], replaced: bool) -> None:
        """The longest match of the answer's tail in the prediction, the nearest one from the anchor on (one before
        it only when clearly longer). A match of CONFIRMED tokens or more is taken; where none is, a token the
        answer wrote in place of the predicted one is taken for a replacement of it (a renamed word: what follows
        it is predicted as before), else a one-token match, tentatively (the anchor stays)."""
        prediction = a.prediction
        end, n = suffix_match(prediction, tail, a.anchor, len(prediction), earliest=True)
        end_b, n_b = suffix_match(prediction, tail, 0, a.anchor, earliest=False)
        if n_b >= n + BACKWARD_MARGIN:
            end, n = end_b, n_b
        if n >= CONFIRMED:
            a.cursor, a.run, a.anchor, a.guessed = end + 1, n, end + 1, False
        elif replaced:
            a.cursor, a.run, a.guessed = a.cursor + 1, 1, True
        elif n:
            a.cursor, a.run, a.guessed = end + 1, 1, False
        else:
            a.run, a.guessed = 0, False
