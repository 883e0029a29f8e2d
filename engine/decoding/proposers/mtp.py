"""A target's own MTP ("nextn") head drafts, through llama.cpp's MTP graph, as common/speculative.cpp's draft-mtp does
(mtp_head.py: the head's context and the protocol; ../shared/DESIGN.md, "Built-in drafters").

The target is loaded with its MTP layers (LoadSettings.mtp), so each of its decodes leaves the hidden row of every
token in Model.hidden, kept by position as its KV cache is. The head has a context of its own on the same weights
(MtpHead), one sequence per target sequence. A proposal first catches the head up on what the target kept since the
last one, lazily as a draft model does (so a head the planner never asks costs nothing): token k is fed with the
target's row k-1, up to and with the history's last token, whose logits give the first draft; each further draft
is the head fed its own draft and its own hidden row. Drafts are greedy (llama.cpp's draft-mtp takes the top
token too) and stop below the confidence p_min; they are point masses to the verifier (Proposal.probs None), which
keeps sampled output the target's own. After n drafts are kept, the head's next catch-up starts at the first
draft it had fed itself: the target's verify rows are what it is fed from there (after n kept, verify row n).

It is a costly proposer: planned before it drafts, its tokens and catch-up timed, like a draft model's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ...errors import InvalidSettingError
from ...methods import DEFAULT_P_MIN, MTP_MAX_DRAFT
from ..mtp_head import HEAD_BATCH, MtpHead
from ..runtime import Model, common_prefix
from ..sampling import SamplingParams
from .base import Ingredients, Proposal, Want
from .draft_model import CATCH_UP_APART, CATCH_UP_TIMED_ROWS
from .head_drafts import Row as _Row
from .head_drafts import draft_greedy


def require_mtp(target: Model) -> None:
    """An MTP head llama.cpp can run on this target, else a sentence saying why not (never an abort)."""
    problem = target.mtp_problem
    if problem is None and target.hidden is None:
        problem = "its context does not emit hidden rows."
    if problem:
        raise InvalidSettingError(
            f"The mtp method drafts with a model's own MTP (nextn) layers; {target.path.name} cannot: {problem}"
        )


@dataclass
class _HeadSlot:
    caught: list[int] = field(default_factory=list)  # tokens in the head's cache, fed with the target's own rows


class MtpProposer:
    name = "mtp"
    source = "mtp"  # its drafts, as the stats count them: apart from a draft model's
    free = False
    alternatives = ()
    model: Model | None = None  # the head's weights are the target's: no second model to count

    def __init__(self, target: Model, p_min: float = DEFAULT_P_MIN):
        require_mtp(target)
        if not 0.0 <= p_min < 1.0:
            raise InvalidSettingError(f"draft confidence cutoff must be in [0, 1), got {p_min!r}")
        self.target, self.p_min = target, p_min
        self._head: MtpHead | None = None
        self._slots: dict[int, _HeadSlot] = {}
        self.last_catch_up = (0, 0.0)  # the last proposal's catch-up: rows decoded apart, seconds

    @property
    def head(self) -> MtpHead:
        """The head's context, opened on first use for as many sequences as the target's context has."""
        target = self.target
        if self._head is None or self._head.n_seq_max < target.settings.n_seq_max:
            if self._head is not None:
                self._head.close()
            n_ctx, threads, n_seq_max = target.n_ctx, target.threads, target.settings.n_seq_max
            self._head = target.open_attached(lambda weights: MtpHead(weights, n_ctx, threads, n_seq_max))
            self._slots.clear()
        return self._head

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        if slot not in self._slots:  # else the chat's next turn: the head's cache holds the conversation so far
            self.head.forget_from(0, slot)
            self._slots[slot] = _HeadSlot()

    def finish(self, slot: int, history: Sequence[int]) -> None:
        pass  # the cache stays for a next request on this sequence

    def lag(self, slot: int, history: Sequence[int]) -> int:
        """Tokens of `history` the head would catch up on before drafting (its last token aside)."""
        state = self._slots.get(slot)
        return len(history) - 1 - (self._reusable(state, history) if state else 0)

    @staticmethod
    def _reusable(state: _HeadSlot, history: Sequence[int]) -> int:
        return min(common_prefix(state.caught, history), len(history) - 1)

    def time_draft(self, slot: int) -> tuple[float, float]:
        """Seconds of one drafted token (a one-row decode of the head, warm) and of one row of catch-up (a
        CATCH_UP_TIMED_ROWS-row decode, per row), in the head's free cells after `slot`'s, rolled back after."""
        head, target = self.head, self.target
        start = head.next_position(slot)
        rows = max(1, min(CATCH_UP_TIMED_ROWS, HEAD_BATCH, target.n_ctx - start - 1))
        zeros = np.zeros((rows, head.n_embd), dtype=np.float32)
        token = max(target.bos, 0)

        def timed(n: int) -> float:
            t = time.perf_counter()
            try:
                head.decode([token] * n, range(start, start + n), zeros[:n], [i == n - 1 for i in range(n)], [slot] * n)
                return time.perf_counter() - t
            finally:
                head.forget_from(start, slot)

        timed(1)  # warm
        return min(timed(1), timed(1)), timed(rows) / rows

    def propose(self, wants: list[Want]) -> list[Proposal]:
        wants = [(slot, h, max(0, min(k, MTP_MAX_DRAFT, self.target.n_ctx - len(h)))) for slot, h, k in wants]
        t, caught_rows = time.perf_counter(), 0
        rows: list[_Row] = []
        for slot, history, k in wants:
            if k > 0:
                caught_rows += self._catch_up(slot, history, rows)
        self.last_catch_up = (caught_rows, time.perf_counter() - t if caught_rows else 0.0)
        drafts = draft_greedy(
            self.head, {slot: (len(history), k) for slot, history, k in wants if k > 0}, rows, self.p_min, lag=1
        )
        return [Proposal(tokens=drafts.get(slot, []), source=self.source) for slot, _, _ in wants]

    def _catch_up(self, slot: int, history: Sequence[int], rows: list[_Row]) -> int:
        """Feed the head what the target kept since its last proposal: a long stretch decoded now (its rows
        returned, timed apart), the rest (the last token at least, whose logits give the first draft) added to
        `rows`, the first decode of the drafting."""
        head, state = self.head, self._slots[slot]
        keep, last = self._reusable(state, history), len(history) - 1
        head.forget_from(keep, slot)
        hidden = self._target_rows(slot, keep, last)
        state.caught = list(history)
        apart = last - keep if last - keep >= CATCH_UP_APART else 0
        for begin in range(keep, keep + apart, HEAD_BATCH):
            end = min(begin + HEAD_BATCH, keep + apart)
            n = end - begin
            head.decode(
                history[begin:end], range(begin, end), hidden[begin - keep : end - keep], [False] * n, [slot] * n
            )
        rows += [(history[p], p, slot, hidden[p - keep], p == last) for p in range(keep + apart, last + 1)]
        return apart

    def _target_rows(self, slot: int, keep: int, last: int) -> np.ndarray:
        """The target's hidden rows that tokens keep..last follow (positions keep-1..last-1; before the first token,
        a zero row). Rows the target no longer holds (never expected) are zero: the head then guesses from its
        tokens alone, which costs acceptance, never correctness."""
        hidden, width = self.target.hidden, self.head.n_embd
        start = max(keep - 1, 0)
        got = hidden.rows(slot, start, last) if hidden is not None else None
        if got is None:
            got = np.zeros((last - start, width), dtype=np.float32)
        if keep == 0:
            got = np.concatenate([np.zeros((1, width), dtype=np.float32), got])
        return got


def build(ingredients: Ingredients) -> MtpProposer:
    return MtpProposer(ingredients.target, ingredients.p_min)
