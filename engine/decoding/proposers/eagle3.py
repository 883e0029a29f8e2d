"""An EAGLE-3 head drafts for its target: a draft file whose header says eagle3 (`--draft HEAD.gguf`) is driven as
common/speculative.cpp's draft-eagle3 drives it (eagle3_head.py has the head's context; ../shared/DESIGN.md,
"Built-in drafters").

The target keeps the inputs of the head's three target layers for every token it decodes (Model.keep_layer_inputs,
kept by position as its KV cache is). The head's cache holds, at position P, the token of P+1 fed with g_P (the
encoded features of P). A proposal first catches the head up on what the target kept since the last one, lazily as
a draft model does: the features of positions it lacks are encoded, and each is fed with the token after it, up to
the pair of the history's last token, whose logits give the first draft; each further draft is the head fed its own
draft and its own pre-norm row, one position on. Drafts are greedy and stop below the confidence p_min (llama.cpp's
rule); they are point masses to the verifier (Proposal.probs None), so sampled output stays the target's own. What
the target rejects is cut from the head's cache at the next proposal, which feeds those positions the target's rows.

It is a costly proposer: planned before it drafts, its tokens and catch-up (encoding included) timed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import llama_cpp as L
import numpy as np
import torch

from ...errors import InvalidSettingError
from ...methods import DEFAULT_P_MIN, MTP_MAX_DRAFT
from ...modelfiles.model_inspect import HEAD_SUPPORT, inspect_model
from ...modelfiles.vocab_check import require_compatible
from ..eagle3_head import Eagle3Head
from ..layer_inputs import LayerInputs, layer_input_problem
from ..mtp_head import HEAD_BATCH
from ..runtime import Model, common_prefix
from ..sampling import SamplingParams
from .base import Ingredients, Proposal, Want
from .draft_model import CATCH_UP_APART, CATCH_UP_TIMED_ROWS
from .head_drafts import Row as _Row
from .head_drafts import draft_greedy

SOURCE = "eagle3"
# Its drafts feed on its own pre-norm rows, so they fade with depth as an MTP head's do: the same cap.
MAX_DRAFT = MTP_MAX_DRAFT


def eagle3_problem(head: Model, target: Model) -> str | None:
    """Why this EAGLE-3 head cannot draft for this target with this llama.cpp, or None (never an abort)."""
    drafter = inspect_model(head.path)["drafter"] or {}
    layers = list(drafter.get("target_layers") or [])
    if len(layers) != 3:
        return f"an EAGLE-3 head reads 3 of its target's layers; {head.path.name} names {len(layers)}."
    arch = target.meta("general.architecture") or "?"
    problem = layer_input_problem(arch, target.n_layer, layers)
    if problem:
        return problem
    width = head.meta("eagle3.target_hidden_size")
    if width is not None and int(width) != target.n_embd:
        return f"the head was made for a target {width} wide; {target.path.name} is {target.n_embd} wide."
    return None


@dataclass
class _HeadSlot:
    caught: list[int] = field(default_factory=list)  # the history its cache was last caught up on


class Eagle3Proposer:
    name = "draft"  # the method it serves (draft or auto's drafter), as the stats say it
    source = SOURCE  # its drafts, as the stats count them: apart from a draft model's
    free = False
    alternatives = ()

    def __init__(self, head: Model, target: Model, p_min: float = DEFAULT_P_MIN):
        if not 0.0 <= p_min < 1.0:
            raise InvalidSettingError(f"draft confidence cutoff must be in [0, 1), got {p_min!r}")
        problem = eagle3_problem(head, target)
        if problem:
            raise InvalidSettingError(f"{head.path.name} is an EAGLE-3 head that cannot draft here: {problem}")
        require_compatible(target, head)
        self.model, self.target, self.p_min = head, target, p_min  # model: the head's weights count in the stats
        layers = list(inspect_model(head.path)["drafter"]["target_layers"])
        self.features: LayerInputs = target.keep_layer_inputs(layers)
        self._head: Eagle3Head | None = None
        self._slots: dict[int, _HeadSlot] = {}
        self.last_catch_up = (0, 0.0)  # the last proposal's catch-up: rows decoded apart, seconds

    @property
    def head(self) -> Eagle3Head:
        """The head's context, opened on first use, and again after the target's context was (it borrows it)."""
        target, old = self.target, self._head
        if old is None or old.ctx is None or old.n_seq_max < target.settings.n_seq_max:
            if old is not None:
                old.close()
            n_ctx, threads, n_seq_max = target.n_ctx, target.threads, target.settings.n_seq_max

            def open_head(target_ctx: L.llama_context_p) -> Eagle3Head:
                return self.model.open_attached(
                    lambda weights: Eagle3Head(weights, target_ctx, n_ctx, threads, n_seq_max)
                )

            self._head = head = target.borrow_context(open_head)
            self._slots = {slot: _HeadSlot() for slot in self._slots}  # a new context: every cache empty
            return head
        return old

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        if slot not in self._slots:  # else the chat's next turn: the head's cache holds the conversation so far
            self.head.forget_from(0, slot)
            self._slots[slot] = _HeadSlot()

    def finish(self, slot: int, history: Sequence[int]) -> None:
        pass  # the cache stays for a next request on this sequence

    @staticmethod
    def _keep(state: _HeadSlot | None, history: Sequence[int]) -> int:
        """Head positions still right for `history`: position P holds history[P + 1] and the features of P, and the
        last pair (history's last token) is fed again with the drafting, for its logits."""
        if state is None:
            return 0
        return max(0, min(common_prefix(state.caught, history) - 1, len(history) - 2))

    def lag(self, slot: int, history: Sequence[int]) -> int:
        """Pairs the head would catch up on before drafting (the last one aside)."""
        return max(0, len(history) - 2 - self._keep(self._slots.get(slot), history))

    def time_draft(self, slot: int) -> tuple[float, float]:
        """Seconds of one drafted token (a one-row decode of the head, warm) and of one row of catch-up (an encode
        and a decode of CATCH_UP_TIMED_ROWS rows, per row), in the head's free cells after `slot`'s, rolled back."""
        head, target = self.head, self.target
        start = head.next_position(slot)
        rows = max(1, min(CATCH_UP_TIMED_ROWS, HEAD_BATCH, target.n_ctx - start - 1))
        features = np.zeros((rows, self.features.width), dtype=np.float32)
        token = max(target.bos, 0)

        def timed(n: int, encode: bool) -> float:
            t = time.perf_counter()
            try:
                g = head.encode(features[:n]) if encode else np.zeros((n, head.n_embd), dtype=np.float32)
                head.decode([token] * n, range(start, start + n), g, [i == n - 1 for i in range(n)], [slot] * n)
                return time.perf_counter() - t
            finally:
                head.forget_from(start, slot)

        timed(1, False)  # warm
        return min(timed(1, False), timed(1, False)), timed(rows, True) / rows

    def propose(self, wants: list[Want]) -> list[Proposal]:
        wants = [(slot, h, max(0, min(k, MAX_DRAFT, self.target.n_ctx - len(h)))) for slot, h, k in wants]
        wants = [(slot, h, k if len(h) >= 2 else 0) for slot, h, k in wants]  # a pair needs a token after a row
        t, caught_rows = time.perf_counter(), 0
        rows: list[_Row] = []
        for slot, history, k in wants:
            if k > 0:
                caught_rows += self._catch_up(slot, history, rows)
        self.last_catch_up = (caught_rows, time.perf_counter() - t if caught_rows else 0.0)
        drafts = draft_greedy(
            self.head, {slot: (len(history), k) for slot, history, k in wants if k > 0}, rows, self.p_min, lag=2
        )
        return [Proposal(tokens=drafts.get(slot, []), source=self.source) for slot, _, _ in wants]

    def _catch_up(self, slot: int, history: Sequence[int], rows: list[_Row]) -> int:
        """Feed the head the pairs it lacks: a long stretch decoded now (its rows returned, timed apart), the rest
        (the last pair at least, whose logits give the first draft) added to `rows`, the drafting's first decode."""
        head, state = self.head, self._slots[slot]
        keep, last = self._keep(state, history), len(history) - 2
        head.forget_from(keep, slot)
        g = head.encode(self._features(slot, keep, last + 1))
        state.caught = list(history)
        apart = last - keep if last - keep >= CATCH_UP_APART else 0
        for begin in range(keep, keep + apart, HEAD_BATCH):
            end = min(begin + HEAD_BATCH, keep + apart)
            tokens = history[begin + 1 : end + 1]
            head.decode(
                tokens, range(begin, end), g[begin - keep : end - keep], [False] * len(tokens), [slot] * len(tokens)
            )
        rows += [(history[p + 1], p, slot, g[p - keep], p == last) for p in range(keep + apart, last + 1)]
        return apart

    def _features(self, slot: int, start: int, stop: int) -> np.ndarray:
        """The target's kept layer inputs of positions [start, stop); zeros where it holds none (never expected:
        the head then guesses from its tokens alone, which costs acceptance, never correctness)."""
        got = self.features.rows.rows(slot, start, stop)
        return got if got is not None else np.zeros((stop - start, self.features.width), dtype=np.float32)


def build_for_head(head: Model, ingredients: Ingredients) -> Eagle3Proposer:
    """The proposer of a draft file that is a draft head: EAGLE-3 drafts; any other kind is refused with the sentence
    the Models window shows for it (model_inspect.HEAD_SUPPORT)."""
    kind = head.head_kind or ""
    reason = HEAD_SUPPORT.get(kind, f"SpecChat cannot draft with {kind} heads.")
    if kind != SOURCE and reason:
        raise InvalidSettingError(f"{head.path.name}: {reason}")
    return Eagle3Proposer(head, ingredients.target, ingredients.p_min)
