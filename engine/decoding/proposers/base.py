"""The protocol every proposer follows, for any number of sequences at once (the chat asks for one, the lab and the
server for many). The step loop (step.py) and its planning (drafting.py) call a proposer only through it, never by
its class; registry.py builds one from a method's name.

The lifecycle, after llama.cpp's common/speculative.h (begin / draft / accept):

- start(slot, prompt, sampling, device, seed) ("begin"): sequence `slot` starts a request. It comes after the
  request's first token is out, so a first token never waits for a proposer. `seed` is the request's draft stream
  (jobs.py's seed rule); a proposer that samples draws from it alone, so a seed gives one answer on every path.
- propose(wants) ("draft"): one Proposal per (slot, history, most tokens wanted), in order. The history is the
  prompt and every token kept so far, the last one not yet verified. Its length is a cap: the planner has cut
  or will cut it to what pays (a free proposer proposes first and is cut; a costly one is asked for the planned
  length only).
- finish(slot, history) ("end"): the request on `slot` ended with this history (prompt and answer).

There is no accept(): the verdicts go to the planner (drafting.py's Drafting.accept), and a proposer learns what
was kept from the next history it is given (lookup's edits, a draft model's cache catching up to it).

Who owns what:
- the proposer owns its per-sequence state, keyed by slot (lookup's history index and edits, a draft model's KV
  cache and random stream), and anything it keeps across requests (lookup's earlier answers);
- drafting.py owns each sequence's drafting state (its own acceptance table, the shadow proposal, whether its last
  proposal was kept whole: DraftState) and the planners' shared tables and step costs;
- the step loop owns the sequences' histories, verifiers and stats, and the target's KV cache (it rolls rejected
  drafts back); the Batch (batch.py, kv_slots.py) owns which slot a request runs in.

How a proposer is planned follows from two attributes: `free` (costs next to nothing, so it proposes every step and
its unverified proposals are scored as shadows) or not (a CostlyProposer: planned first, timed, its catch-up priced),
and `alternatives` (auto: a free proposer and one or more costly ones weighed per sequence and step; () for a single
proposer).

A new kind of drafter (MTP heads, EAGLE-3) is a new module in this package: a class following Proposer (a
CostlyProposer where each drafted token costs a decode) and a `build(ingredients)` function, plus one line in
registry.py (and its words, label and colour in engine/methods.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from ...errors import InvalidSettingError
from ...methods import DEFAULT_P_MIN
from ..sampling import Candidates, SamplingParams

if TYPE_CHECKING:
    from ..runtime import Model


LOOKUP_SOURCE = "lookup"  # a copy (prompt lookup), and any free proposer's
DRAFT_SOURCE = "draft"  # a draft model's guess
PREDICTION_SOURCE = "prediction"  # a copy of the request's own predicted answer (Predicted Outputs: prediction.py)


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    probs: Candidates | None = None  # q for each token; None means point-mass drafts (lookup)
    match_length: int = 0  # lookup: how many tokens of the history's end matched where the draft was found
    # who proposed it, as the stats, the metrics and the shading count it: "lookup", "draft" (a draft model) or
    # "mtp" (the target's own MTP head); a costly proposer names its own (CostlyProposer.source)
    source: str = LOOKUP_SOURCE
    # lookup, cut to the plan's length: its next token, which the step's own token (after every draft is kept)
    # shows right or wrong, so a slot the plan stopped short of is still observed
    beyond: int | None = None

    @property
    def from_model(self) -> bool:
        """Guessed by a model (a draft model, an MTP head), not copied: its acceptance and cost are kept apart from
        lookup's."""
        return self.source not in (LOOKUP_SOURCE, PREDICTION_SOURCE)


# (sequence id, its history: prompt + everything generated, most tokens wanted)
Want = tuple[int, Sequence[int], int]


class Proposer(Protocol):
    name: str  # the method's name, as the stats say it ("none", "lookup", "draft", "auto")
    free: bool  # proposing costs next to nothing, so proposals can be scored while speculation is off

    @property
    def alternatives(self) -> tuple[Proposer, ...]:
        """The proposers it weighs per sequence and step, a free one first and then each costly one (CostlyProposer);
        () for a single proposer."""

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        """Sequence `slot` starts a request from this prompt, sampled with these settings and seed."""

    def propose(self, wants: list[Want]) -> list[Proposal]:
        """One proposal per want, in order."""

    def finish(self, slot: int, history: Sequence[int]) -> None:
        """Sequence `slot` ended with this history (prompt + answer)."""


class CostlyProposer(Proposer, Protocol):
    """A proposer whose every drafted token costs a decode (a draft model): planned before it drafts."""

    last_catch_up: tuple[int, float]  # the last proposal's catch-up, decoded apart: rows, seconds
    source: str  # its drafts' Proposal.source, as the stats count them (DRAFT_SOURCE, "mtp")

    @property
    def model(self) -> Model | None:
        """The model it runs (its weights count in the stats); None for a replay's stand-in."""

    def lag(self, slot: int, history: Sequence[int]) -> int:
        """Rows it would decode to catch up on `history` before drafting."""

    def time_draft(self, slot: int) -> tuple[float, float]:
        """Seconds of one drafted token and of one row of catch-up, timed now (the step loop's calibration)."""


@dataclass(frozen=True)
class Ingredients:
    """What a proposer may be built from (registry.py hands these to a method's build function)."""

    target: Model
    draft: Model | None = None  # a draft model loaded for the methods that need one
    p_min: float = DEFAULT_P_MIN  # a draft model's confidence cutoff
    min_ngram: int = 1  # lookup's shortest match
    max_ngram: int | None = None  # lookup's longest match (None: lookup's default)
    remember_requests: bool = True  # lookup also searches earlier answers

    def draft_model(self, method: str) -> Model:
        """The draft model, which `method` needs."""
        if self.draft is None:
            raise InvalidSettingError(f"The {method} method needs a draft model.")
        return self.draft


class NoProposer:
    """Plain decoding through the same loop."""

    name = "none"
    free = True
    alternatives = ()

    def start(
        self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int
    ) -> None:
        pass

    def propose(self, wants: list[Want]) -> list[Proposal]:
        return [Proposal() for _ in wants]

    def finish(self, slot: int, history: Sequence[int]) -> None:
        pass


def build(ingredients: Ingredients) -> NoProposer:
    return NoProposer()
