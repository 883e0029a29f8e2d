"""The interface every proposer follows (the lifecycle of llama.cpp's common/speculative.h)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from ..sampling import Candidates, SamplingParams


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    probs: Candidates | None = None  # q for each token; None means point-mass drafts (lookup)


class Proposer(Protocol):
    name: str
    # True when proposing costs next to nothing, so proposals can be scored while speculation is off.
    free: bool

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int) -> None:
        """A new request starts from this prompt, sampled with these settings and this seed."""

    def propose(self, history: Sequence[int], max_tokens: int) -> Proposal:
        """Draft up to max_tokens tokens to follow history (prompt + everything generated)."""

    def feedback(self, drafted: int, accepted: int) -> None:
        """How many of the last proposal's tokens the target verified and kept."""


class NoProposer:
    """Plain decoding through the same loop."""

    name = "none"
    free = True

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int) -> None:
        pass

    def propose(self, history: Sequence[int], max_tokens: int) -> Proposal:
        return Proposal()

    def feedback(self, drafted: int, accepted: int) -> None:
        pass
