"""The interface every proposer follows (the lifecycle of llama.cpp's common/speculative.h), for any
number of sequences at once: the chat asks for one, the lab and the server for many."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..sampling import Candidates, SamplingParams


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    probs: Candidates | None = None  # q for each token; None means point-mass drafts (lookup)
    match_length: int = 0  # lookup: how many tokens of the history's end matched where the draft was found
    from_draft: bool = False  # made by a draft model (its acceptance and cost are kept apart from lookup's)
    # lookup, cut to the plan's length: its next token, which the step's own token (after every draft is kept)
    # shows right or wrong, so a slot the plan stopped short of is still observed
    beyond: int | None = None


# (sequence id, its history: prompt + everything generated, most tokens wanted)
Want = tuple[int, Sequence[int], int]


class Proposer(Protocol):
    name: str
    # True when proposing costs next to nothing, so proposals can be scored while speculation is off.
    # A proposer that is not free also has time_draft(slot) -> (seconds of one drafted token, of one row of
    # catch-up), lag(slot, history) -> rows it would catch up on, last_catch_up (rows, seconds) and model (the
    # draft model it runs).
    free: bool

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        """Sequence `slot` starts a request from this prompt, sampled with these settings and seed."""

    def propose(self, wants: list[Want]) -> list[Proposal]:
        """One proposal per want, in order."""

    def finish(self, slot: int, history: Sequence[int]) -> None:
        """Sequence `slot` ended with this history (prompt + answer)."""


class NoProposer:
    """Plain decoding through the same loop."""

    name = "none"
    free = True

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        pass

    def propose(self, wants: list[Want]) -> list[Proposal]:
        return [Proposal() for _ in wants]

    def finish(self, slot: int, history: Sequence[int]) -> None:
        pass
