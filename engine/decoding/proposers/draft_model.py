"""A smaller GGUF model of the same vocabulary drafts tokens, keeping q for the verifier.

It drafts for every sequence together: each draft position is one batched decode over the sequences
still drafting. Its KV cache follows each sequence lazily: a proposal first decodes whatever the
target kept since the last one (the cache is cut back to the common prefix; the first proposal of a
request decodes its whole prompt, so a draft the planner never calls costs nothing), then drafts one
token at a time, stopping a sequence when its confidence falls below p_min (llama.cpp's rule).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ...errors import InvalidSettingError
from ...methods import DEFAULT_P_MIN
from ...modelfiles.vocab_check import require_compatible
from ..calibration import time_steps
from ..runtime import Model, common_prefix
from ..sampling import Candidates, SamplingParams, filter_logits, make_generator, position_seed
from .base import DRAFT_SOURCE, Ingredients, Proposal, Want

# A sequence whose draft cache lags the target by at least this many tokens (its prompt, or an answer that
# lookup wrote in --method auto) catches up in a prefill of its own, timed apart: folded into the drafted
# tokens' time, the 0.5B's catch-up over a Qwen2.5-Coder chat prompt (2.6 s, a third of the answer's plain
# decode) priced its next two tokens as hopeless, and the draft was never asked again.
CATCH_UP_APART = 8
# Rows of the one wide decode timed up front, which prices catch-up before any has been seen.
CATCH_UP_TIMED_ROWS = 64


def stack_candidates(rows: list[Candidates]) -> Candidates:
    width = max(r.ids.shape[1] for r in rows)
    pad = [(width - r.ids.shape[1]) for r in rows]
    ids = torch.cat([torch.nn.functional.pad(r.ids, (0, p)) for r, p in zip(rows, pad)])
    probs = torch.cat([torch.nn.functional.pad(r.probs, (0, p)) for r, p in zip(rows, pad)])
    return Candidates(ids=ids, probs=probs)


def greedy_pick(row: np.ndarray) -> tuple[int, float]:
    """A greedy draft token from a logits row, and its probability (the confidence p_min is held against)."""
    token = int(row.argmax())
    return token, 1.0 / float(np.exp(row - row[token]).sum())


def check_draft(draft: Model, target: Model, p_min: float) -> None:
    """A usable draft: a cutoff in range and a vocabulary the target can verify."""
    if not 0.0 <= p_min < 1.0:
        raise InvalidSettingError(f"draft confidence cutoff must be in [0, 1), got {p_min!r}")
    require_compatible(target, draft)


@dataclass
class _DraftSlot:
    sampling: SamplingParams
    device: torch.device
    seed: int  # the draft's own stream, still reproducible
    generator: torch.Generator
    prompt: Sequence[int] = ()  # the request's prompt, which the target prefilled
    cached: list[int] = field(default_factory=list)  # tokens in the draft's KV cache for this sequence
    agreed: int = 0  # cached[:agreed] is this request's history as of the last proposal (a history only grows)


class DraftModelProposer:
    name = "draft"
    free = False
    alternatives = ()
    source = DRAFT_SOURCE

    def __init__(self, draft: Model, target: Model, p_min: float = DEFAULT_P_MIN):
        check_draft(draft, target, p_min)
        self.model = draft
        self.p_min = p_min
        self._slots: dict[int, _DraftSlot] = {}
        self.last_catch_up = (0, 0.0)  # the last proposal's catch-up: rows prefilled apart, seconds

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        old = self._slots.get(slot)
        state = _DraftSlot(sampling, device, seed, make_generator(seed, device), prompt)
        if old is not None:  # the chat's next turn: its cache still holds the conversation so far
            state.cached = old.cached
        else:
            self.model.forget_from(0, slot)
        self._slots[slot] = state

    def finish(self, slot: int, history: Sequence[int]) -> None:
        pass  # the cache stays: a next request on this sequence (a chat's next turn) reuses its prefix

    def time_draft(self, slot: int) -> tuple[float, float]:
        """Seconds of one draft token (a one-row decode, warm, timed as the target's steps are) and of one row
        of catch-up (a CATCH_UP_TIMED_ROWS-row decode, per row), in the free cells after what `slot` holds,
        rolled back after. The planner knows from them, before any draft runs, whether this draft could ever
        pay (a draft as large as its target cannot) and what catching up on a prompt costs."""
        model = self.model
        start = model.next_position(slot)
        rows = max(1, min(CATCH_UP_TIMED_ROWS, model.n_batch, model.n_ctx - start - 1))
        # Its one-row step is timed afresh (a few decodes), not taken from the day's kept timings: one timed on a
        # busy machine priced the 0.5B draft at 3.5 of its target's steps, and a draft judged hopeless never
        # drafts, so no live timing ever corrected it for the rest of the day.
        model.step_timings.pop((model.threads, 1), None)
        timed = time_steps(model, slot, start, max(model.bos, 0), sorted({1, rows}))
        return timed[1], timed[rows] / rows

    def lag(self, slot: int, history: Sequence[int]) -> int:
        """Tokens of `history` the draft would decode before drafting (its last token aside)."""
        state = self._slots.get(slot)
        return len(history) - 1 - (self._reusable(state, history) if state else 0)

    @staticmethod
    def _reusable(state: _DraftSlot, history: Sequence[int]) -> int:
        """How much of `history` the draft's cache holds, at most all but its last token (decoded for its logits).
        Only what follows the agreed part is compared: the step loop asks for every sequence at every step."""
        return min(common_prefix(state.cached, history, min(state.agreed, len(history))), len(history) - 1)

    def propose(self, wants: list[Want]) -> list[Proposal]:
        room = self.model.n_ctx
        rows: list[tuple[int, int, int, bool]] = []  # (token, position, slot, wants logits)
        wants = [(slot, history, max(0, min(k, room - len(history)))) for slot, history, k in wants]
        caught_rows, t = 0, time.perf_counter()
        for slot, history, k in wants:
            if k <= 0:
                continue
            state = self._slots[slot]
            keep = self._reusable(state, history)
            self.model.forget_from(keep, slot)
            state.cached, state.agreed = list(history), len(history)
            if keep < len(state.prompt) < len(history):
                # The prompt in the target's own chunks: llama.cpp's CPU kernels round differently by batch
                # size, so only the same chunks give the same cache (a draft equal to its target, greedy,
                # lost 11% of its tokens to a prompt decoded with the answer's first token appended).
                self.model.prefill(history[keep : len(state.prompt)], keep, slot)
                caught_rows, keep = caught_rows + len(state.prompt) - keep, len(state.prompt)
            if len(history) - 1 - keep >= CATCH_UP_APART:
                self.model.prefill(history[keep:-1], keep, slot)
                caught_rows, keep = caught_rows + len(history) - 1 - keep, len(history) - 1
            new = history[keep:]
            rows += [(tok, keep + j, slot, j == len(new) - 1) for j, tok in enumerate(new)]
        self.last_catch_up = (caught_rows, time.perf_counter() - t if caught_rows else 0.0)
        picks = self._decode_and_pick(rows)
        drafts: dict[int, list[int]] = {slot: [] for slot, _, _ in wants}
        q_rows: dict[int, list[Candidates]] = {slot: [] for slot, _, _ in wants}
        live = [(slot, k) for slot, _, k in wants if k > 0]
        while live:
            rows, still = [], []
            for slot, k in live:
                token, confidence, q = picks[slot]
                if confidence < self.p_min:
                    continue
                drafts[slot].append(token)
                if q is not None:
                    q_rows[slot].append(q)
                if len(drafts[slot]) == k:
                    continue
                state = self._slots[slot]
                rows.append((token, len(state.cached), slot, True))
                state.cached.append(token)
                still.append((slot, k))
            live = still
            if rows:
                picks = self._decode_and_pick(rows)
        return [
            Proposal(
                tokens=drafts[slot], probs=stack_candidates(q_rows[slot]) if q_rows[slot] else None, source=self.source
            )
            for slot, _, _ in wants
        ]

    def _decode_and_pick(
        self, rows: list[tuple[int, int, int, bool]]
    ) -> dict[int, tuple[int, float, Candidates | None]]:
        """Decode rows (in n_batch chunks); pick each sequence's next draft token from its logits row."""
        picks = {}
        n_batch = self.model.n_batch
        for begin in range(0, len(rows), n_batch):
            chunk = rows[begin : begin + n_batch]
            tokens, positions, slots, want = zip(*chunk)
            logits = self.model.decode_multi(tokens, positions, slots, want)
            wanted = [slot for slot, w in zip(slots, want) if w]
            for i, slot in enumerate(wanted):
                state = self._slots[slot]
                picks[slot] = self._pick(state, logits[i], position=len(state.cached))
        return picks

    @staticmethod
    def _pick(state: _DraftSlot, row: np.ndarray, position: int) -> tuple[int, float, Candidates | None]:
        """The draft token for sequence index `position`, its confidence, and q when sampling."""
        if state.sampling.greedy:
            return (*greedy_pick(row), None)
        q = filter_logits(torch.from_numpy(row).to(state.device).view(1, -1), state.sampling)
        state.generator.manual_seed(position_seed(state.seed, position))
        return q.sample(0, state.generator), float(q.probs[0].max()), q


def build(ingredients: Ingredients) -> DraftModelProposer:
    """A draft model's proposer (draft_file.py chooses it, or a head's, for the draft file given)."""
    return DraftModelProposer(ingredients.draft_model("draft"), ingredients.target, ingredients.p_min)
