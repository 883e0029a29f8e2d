"""Prompt lookup and every drafter the models offer (a draft model, the target's own MTP head), together: all are
offered every step, and the planning (drafting.py's AutoDrafting, chosen because this proposer has alternatives)
picks, per sequence and step, whose proposal to verify. Lookup is free to ask, so it is asked first; a drafter runs
only for the sequences its guess won, so a long copy on offer costs no draft tokens (a drafter's cache catches up
lazily, at its next proposal)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ...errors import InvalidSettingError
from ..sampling import SamplingParams
from . import draft_file, lookup, mtp
from .base import CostlyProposer, Ingredients, Proposal, Proposer, Want

if TYPE_CHECKING:
    from ..runtime import Model


class AutoProposer:
    name = "auto"
    free = False  # it may run a drafter

    def __init__(self, lookup: Proposer, *drafters: CostlyProposer):
        if not drafters:
            raise ValueError("auto needs at least one drafter beside lookup")
        self.lookup, self.drafters = lookup, drafters
        self.alternatives = (lookup, *self.drafters)

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        for proposer in self.alternatives:
            proposer.start(slot, prompt, sampling, device, seed)

    def propose(self, wants: list[Want]) -> list[Proposal]:
        """Lookup's copy where it has one, else the first drafter's guess (unplanned: AutoDrafting weighs them)."""
        copies = self.lookup.propose(wants)
        missing = [w for w, c in zip(wants, copies) if not c.tokens]
        guesses = iter(self.drafters[0].propose(missing) if missing else [])
        return [c if c.tokens else next(guesses) for c in copies]

    def finish(self, slot: int, history: Sequence[int]) -> None:
        for proposer in self.alternatives:
            proposer.finish(slot, history)

    @property
    def model(self) -> Model | None:
        """The draft model, where one drafts (an MTP head's weights are the target's)."""
        return next((d.model for d in self.drafters if d.model is not None), None)


def build(ingredients: Ingredients) -> AutoProposer:
    """Lookup with the draft model where one is given and the target's MTP head where it has one loaded."""
    drafters: list[CostlyProposer] = []
    if ingredients.draft is not None:
        drafters.append(draft_file.build(ingredients))
    if ingredients.target.mtp_problem is None and ingredients.target.hidden is not None:
        drafters.append(mtp.build(ingredients))
    if not drafters:
        raise InvalidSettingError(
            "The auto method needs a draft model, or a model with its own MTP (nextn) layers to draft with."
        )
    return AutoProposer(lookup.build(ingredients), *drafters)
