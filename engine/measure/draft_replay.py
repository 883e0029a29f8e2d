"""A draft model's guesses, recorded once along greedy answers and replayed on a virtual clock.

Greedy drafting is deterministic, so what the draft would propose at every position of an answer can be
recorded ahead: one pass of the draft over prompt + answer gives its pick and confidence after each prefix,
and while its picks follow the answer its own drafting is that same pass. So a position's proposal is
described by two numbers, how many of its tokens the answer keeps and how many it drafts before its
confidence falls below p_min (llama.cpp's rule, as DraftModelProposer's); only where it is confidently
wrong is it run on from its own wrong token, to see how much more it would draft. ReplayDraft then stands in
for DraftModelProposer in the real StepLoop (alone for --method draft, under AutoProposer for auto),
charging its catch-up and its drafted tokens to the clock from the draft's step-cost curve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..decoding.proposers.base import DRAFT_SOURCE, Proposal, Want
from ..decoding.proposers.draft_model import CATCH_UP_APART, CATCH_UP_TIMED_ROWS, greedy_pick
from ..decoding.runtime import Model, common_prefix
from ..methods import MAX_DRAFT_LIMIT


def draft_runs(
    draft: Model, prompt: Sequence[int], answer: Sequence[int], p_min: float, longest: int = MAX_DRAFT_LIMIT
) -> tuple[list[int], list[int]]:
    """Per answer position i (the answer's first i tokens written): how many tokens the draft's greedy
    proposal would have that the answer keeps, and how many it would draft (up to `longest`)."""
    start, n = len(prompt), len(answer)
    draft.forget_all()
    for begin in range(0, start, draft.n_batch):  # the prompt in the target's chunks, as DraftModelProposer's
        part = prompt[begin : begin + draft.n_batch]
        draft.decode_multi(part, range(begin, begin + len(part)), [0] * len(part), [False] * len(part))
    # The answer a row at a time, as drafting decodes: llama.cpp's CPU kernels round differently by batch size,
    # and a pick from one wide batch put a confidence of ~p_min on the other side of it (the 0.5B, once in 48).
    picks = [(0, 0.0)]  # picks[i]: after prompt + answer[:i]; position 0 is the prefill's token, never drafted for
    for i in range(n - 1):
        picks.append(greedy_pick(draft.decode_multi([answer[i]], [start + i], [0], [True])[0]))
    kept, made = [0] * (n + 1), [0] * (n + 1)
    for i in range(n - 1, 0, -1):  # from the end, cutting the cache back as it goes: nothing is re-decoded
        token, confidence = picks[i]
        if confidence < p_min:
            continue
        if token == answer[i]:
            kept[i], made[i] = 1 + kept[i + 1], 1 + made[i + 1]
        else:
            made[i] = 1 + _drafted_after(draft, start + i, token, p_min, longest - 1)
    draft.forget_all()
    return [min(k, longest) for k in kept[:n]], [min(m, longest) for m in made[:n]]


def _drafted_after(draft: Model, position: int, token: int, p_min: float, most: int) -> int:
    """How many more tokens the draft drafts after its own `token` at `position` (the cache holds what precedes
    it): its greedy run while confident."""
    draft.forget_from(position)
    count = 0
    while count < most:
        token, confidence = greedy_pick(draft.decode_multi([token], [position + count], [0], [True])[0])
        if confidence < p_min:
            break
        count += 1
    draft.forget_from(position)
    return count


class ReplayDraft:
    """DraftModelProposer's part in the step loop, on a replay's clock: each proposal is the recorded one cut to
    what the planner asked for, and costs what the draft's decodes would (its catch-up in the target's chunks,
    then one decode per drafted token, as DraftModelProposer makes them)."""

    name = "draft"
    free = False
    alternatives = ()
    source = DRAFT_SOURCE
    model = None  # no weights held

    def __init__(
        self, seconds: Callable[[int], float], advance: Callable[[float], None], n_batch: int = 512, pick_width: int = 0
    ):
        self.seconds, self.advance, self.n_batch = seconds, advance, n_batch
        # pick_width: make each decode's pick for real on a row this wide, so a clock that counts the host's time
        # (a replay's host_time) pays what DraftModelProposer's picks cost over its vocabulary
        self._row = np.random.default_rng(0).standard_normal(pick_width).astype(np.float32) if pick_width else None
        self.last_catch_up = (0, 0.0)
        self.answer: Sequence[int] = ()
        self.kept: Sequence[int] = ()
        self.made: Sequence[int] = ()
        self._prompt: Sequence[int] = ()
        self._cached = 0  # how much of the history the draft's cache holds

    def follow(self, prompt: Sequence[int], answer: Sequence[int], kept: Sequence[int], made: Sequence[int]) -> None:
        """The answer about to be replayed and its recorded proposals. The cache keeps what the last answer's
        history shares with this prompt, as DraftModelProposer's does (a chat template's opening, at least)."""
        held = (list(self._prompt) + list(self.answer))[: self._cached]
        self._cached = common_prefix(held, prompt)
        self._prompt, self.answer, self.kept, self.made = prompt, answer, kept, made

    def start(self, slot, prompt, sampling, device, seed) -> None:
        pass

    def finish(self, slot, history) -> None:
        pass

    def time_draft(self, slot: int) -> tuple[float, float]:
        return self.seconds(1), self.seconds(CATCH_UP_TIMED_ROWS) / CATCH_UP_TIMED_ROWS

    def lag(self, slot: int, history: Sequence[int]) -> int:
        return len(history) - 1 - min(self._cached, len(history) - 1)

    def _prefill(self, rows: int) -> float:
        """A prefill of `rows` rows, as Model.prefill makes it: in n_batch chunks."""
        return sum(self.seconds(min(self.n_batch, rows - begin)) for begin in range(0, rows, self.n_batch))

    def propose(self, wants: list[Want]) -> list[Proposal]:
        assert len(wants) == 1, "a replay drives one sequence"
        _, history, k = wants[0]
        if k <= 0:
            self.last_catch_up = (0, 0.0)
            return [Proposal(source=DRAFT_SOURCE)]
        keep, spent, caught = min(self._cached, len(history) - 1), 0.0, 0
        if keep < len(self._prompt) < len(history):  # the prompt, in the target's chunks
            spent += self._prefill(len(self._prompt) - keep)
            caught, keep = len(self._prompt) - keep, len(self._prompt)
        if len(history) - 1 - keep >= CATCH_UP_APART:
            spent += self._prefill(len(history) - 1 - keep)
            caught, keep = caught + len(history) - 1 - keep, len(history) - 1
        self.last_catch_up = (caught, spent)
        at = len(history) - len(self._prompt)  # answer tokens written
        drafted, good = min(k, self.made[at]), min(k, self.made[at], self.kept[at])
        decodes = drafted if drafted == k else drafted + 1  # the k-th token is not fed back; a refusal costs one
        spent += self.seconds(len(history) - keep) + (decodes - 1) * self.seconds(1)
        if self._row is not None:
            for _ in range(decodes):
                greedy_pick(self._row)
        self.advance(spent)
        fed = drafted if drafted < k else k - 1
        self._cached = len(history) + min(good, fed)
        wrong = [(self.answer[at + j] + 1) if at + j < len(self.answer) else 0 for j in range(good, drafted)]
        return [Proposal(tokens=list(self.answer[at : at + good]) + wrong, source=DRAFT_SOURCE)]
