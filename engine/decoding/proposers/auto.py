"""Prompt lookup and a draft model together: both are offered every step, and AutoDrafting picks, per sequence
and step, which one's proposal to verify. Lookup is free to ask, so it is asked first; the draft model runs only
for sequences whose lookup proposal lost, so a long copy on offer costs no draft tokens (the draft's cache
catches up lazily, at its next proposal)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from ..cost_model import DraftPlanner, Plan, SpeculationConfig, StepCosts
from ..drafting import Drafted, Drafting, FreeDrafting, ModelDrafting
from ..runtime import Model
from ..sampling import SamplingParams
from .base import Proposal, Want

if TYPE_CHECKING:
    from ..step import SequenceState
    from ..verifier import Verdict
    from .draft_model import DraftModelProposer
    from .lookup import LookupProposer


class AutoProposer:
    name = "auto"
    free = False  # it may run the draft model

    def __init__(self, lookup: LookupProposer, draft: DraftModelProposer):
        self.lookup, self.draft = lookup, draft

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        self.lookup.start(slot, prompt, sampling, device, seed)
        self.draft.start(slot, prompt, sampling, device, seed)

    def propose(self, wants: list[Want]) -> list[Proposal]:
        """Lookup's copy where it has one, else the draft model's guess (unplanned: AutoDrafting weighs both)."""
        copies = self.lookup.propose(wants)
        missing = [w for w, c in zip(wants, copies) if not c.tokens]
        guesses = iter(self.draft.propose(missing) if missing else [])
        return [c if c.tokens else next(guesses) for c in copies]

    def finish(self, slot: int, history: Sequence[int]) -> None:
        self.lookup.finish(slot, history)
        self.draft.finish(slot, history)

    @property
    def model(self):
        return self.draft.model

    def time_draft(self, slot: int) -> tuple[float, float]:
        return self.draft.time_draft(slot)


class AutoDrafting(Drafting):
    """Two planners sharing the step costs: `planner` plans lookup's copies, `draft_planner` the draft model's
    guesses (each keeps its own acceptance, realism and probing). Each sequence verifies whichever proposal
    promises more tokens per second of its step, the draft's own tokens counted."""

    proposer: AutoProposer

    def __init__(
        self,
        proposer: AutoProposer,
        speculation: SpeculationConfig,
        steps: StepCosts | None,
        target: Model,
        clock: Callable[[], float],
    ):
        copies = DraftPlanner(speculation, costly_proposer=False, steps=steps)
        super().__init__(proposer, copies, target, speculation, clock)
        self.copies = FreeDrafting(proposer.lookup, copies, target, speculation, clock)
        guesses = DraftPlanner(speculation, costly_proposer=True, steps=copies.steps)
        self.guesses = ModelDrafting(proposer.draft, guesses, target, speculation, clock)

    @property
    def draft_planner(self) -> DraftPlanner:
        return self.guesses.planner

    def draft(self, active: list[SequenceState], room: list[int], tokens_left: list[int]) -> Drafted:
        """Both plan (planning is cheap); the draft model then drafts for the sequences it won alone."""
        copies, copy_plan, caps = self.copies.draft(active, room, tokens_left)
        if copy_plan.measuring_plain:
            return copies, copy_plan, caps
        guess_plan = self.guesses.plan(active, room, tokens_left)
        use_draft = self.choose(len(active), copy_plan, guess_plan)
        self.planner.keep_only(copy_plan, [not u for u in use_draft])
        self.draft_planner.keep_only(guess_plan, use_draft)
        wanted = Plan([g if u else 0 for g, u in zip(guess_plan.lengths, use_draft)], guess_plan.measuring_plain)
        guesses, _, _ = self.guesses.draft(active, room, tokens_left, wanted)
        chosen = [g if u else c for c, g, u in zip(copies, guesses, use_draft)]
        lengths = [g if u else c for c, g, u in zip(copy_plan.lengths, guess_plan.lengths, use_draft)]
        return chosen, Plan(lengths, guess_plan.measuring_plain), room  # room bounds both proposals

    def choose(self, n: int, copy_plan: Plan, guess_plan: Plan) -> list[bool]:
        """Per sequence: does the draft model's guess promise more tokens per second of the step than the copy?"""
        steps, d = self.planner.steps, self.draft_planner.draft_seconds_per_token

        def rate(plan: Plan, k: int, i: int, drafting: float) -> float:
            gained = plan.expected[i] if k else 0.0
            return (n + gained) / ((steps.seconds(n + k, drafted=k > 0) or 1.0) + drafting * k)

        # A draft plan that bets on nothing (a probe, or fixed lengths) is taken where lookup offers no copy.
        return [
            bool(g) and (rate(guess_plan, g, i, d) > rate(copy_plan, c, i, 0.0) if guess_plan.expected else not c)
            for i, (c, g) in enumerate(zip(copy_plan.lengths, guess_plan.lengths))
        ]

    def record_outcome(self, proposals: list[Proposal], verdicts: list[Verdict]) -> None:
        """Each planner learns from its own proposer's drafts."""
        drafted = [p.from_draft for p in proposals]
        self.draft_planner.count_step(any(p.tokens and p.from_draft for p in proposals))
        self.draft_planner.record_outcome(sum(v.accepted for v, d in zip(verdicts, drafted) if d))
        self.planner.record_outcome(sum(v.accepted for v, d in zip(verdicts, drafted) if not d))

    def time_draft(self, slot: int) -> None:
        self.guesses.time_draft(slot)
