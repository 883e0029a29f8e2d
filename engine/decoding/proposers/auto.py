"""Prompt lookup and a draft model together: both are offered every step, and the planning (drafting.py's
AutoDrafting, chosen because this proposer has alternatives) picks, per sequence and step, which one's proposal to
verify. Lookup is free to ask, so it is asked first; the draft model runs only for sequences whose lookup proposal
lost, so a long copy on offer costs no draft tokens (the draft's cache catches up lazily, at its next proposal)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..sampling import SamplingParams
from . import draft_model, lookup
from .base import CostlyProposer, Ingredients, Proposal, Proposer, Want

if TYPE_CHECKING:
    from ..runtime import Model


class AutoProposer:
    name = "auto"
    free = False  # it may run the draft model

    def __init__(self, lookup: Proposer, draft: CostlyProposer):
        self.lookup, self.draft = lookup, draft
        self.alternatives = (lookup, draft)

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
    def model(self) -> Model | None:
        return self.draft.model

    def time_draft(self, slot: int) -> tuple[float, float]:
        return self.draft.time_draft(slot)


def build(ingredients: Ingredients) -> AutoProposer:
    ingredients.draft_model("auto")  # said as auto's need, not the draft method's
    drafter = draft_model.build(ingredients)
    return AutoProposer(lookup.build(ingredients), drafter)
