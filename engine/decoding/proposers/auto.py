"""Prompt lookup and a draft model together: both are offered every step, and the step loop's planner picks,
per sequence and step, which one's proposal to verify (step.StepLoop._propose_auto). Lookup is free to ask, so
it is asked first; the draft model runs only for sequences whose lookup proposal the planner turned down, so a
long copy on offer costs no draft tokens (the draft's cache catches up lazily, at its next proposal)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..sampling import SamplingParams

if TYPE_CHECKING:  # the draft proposer imports the step loop, which knows this class
    from .draft_model import DraftModelProposer
    from .lookup import LookupProposer


class AutoProposer:
    name = "auto"
    free = False  # it may run the draft model

    def __init__(self, lookup: LookupProposer, draft: DraftModelProposer):
        self.lookup, self.draft = lookup, draft

    def start(self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device,
              seed: int) -> None:
        self.lookup.start(slot, prompt, sampling, device, seed)
        self.draft.start(slot, prompt, sampling, device, seed)

    def finish(self, slot: int, history: Sequence[int]) -> None:
        self.lookup.finish(slot, history)
        self.draft.finish(slot, history)

    @property
    def model(self):
        return self.draft.model

    def time_draft(self, slot: int) -> tuple[float, float]:
        return self.draft.time_draft(slot)
