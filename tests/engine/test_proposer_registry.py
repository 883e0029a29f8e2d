"""Proposers behind one protocol (issue 64): every method is built from the registry by its name, and how a proposer
is planned follows from what its protocol says (free, costly, alternatives), never from its class, so a new kind of
drafter is a new module and one registry line."""

from collections.abc import Sequence
from types import SimpleNamespace

import pytest
import torch

from engine.decoding.drafting import AutoDrafting, FreeDrafting, ModelDrafting, drafting_for
from engine.decoding.proposers.base import Ingredients, NoProposer, Proposal, Want
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.proposers.registry import BUILDERS, build_proposer
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig
from engine.errors import InvalidSettingError
from engine.methods import METHODS


class Unknown:
    """A proposer of no class the engine knows: only the protocol."""

    name = "unknown"
    alternatives = ()
    source = "draft"  # its drafts, as the stats count them (CostlyProposer.source)

    def __init__(self, free: bool):
        self.free = free
        self.model = None
        self.last_catch_up = (0, 0.0)

    def start(self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int):
        pass

    def propose(self, wants: list[Want]) -> list[Proposal]:
        return [Proposal() for _ in wants]

    def finish(self, slot: int, history: Sequence[int]) -> None:
        pass

    def lag(self, slot: int, history: Sequence[int]) -> int:
        return 0

    def time_draft(self, slot: int) -> tuple[float, float]:
        return 0.001, 0.001


class Pair(Unknown):
    def __init__(self):
        super().__init__(free=False)
        self.alternatives = (Unknown(free=True), Unknown(free=False))


def test_every_method_has_a_builder_and_none_is_plain():
    assert set(BUILDERS) == set(METHODS)
    assert isinstance(build_proposer("none", Ingredients(target=None)), NoProposer)
    lookup = build_proposer("lookup", Ingredients(target=None, min_ngram=2, max_ngram=5, remember_requests=False))
    assert isinstance(lookup, LookupProposer) and (lookup.min_ngram, lookup.max_ngram) == (2, 5)


@pytest.mark.parametrize("method", ["draft", "auto"])
def test_a_method_that_drafts_says_it_needs_a_draft_model(method):
    """Auto drafts with the target's own MTP head where it has one; this target has none."""
    without_mtp = SimpleNamespace(mtp_problem="it was loaded without its MTP layers.", hidden=None)
    with pytest.raises(InvalidSettingError, match=f"The {method} method needs a draft model"):
        build_proposer(method, Ingredients(target=without_mtp))


def test_an_unknown_method_is_refused():
    with pytest.raises(InvalidSettingError, match="magic"):
        build_proposer("magic", Ingredients(target=None))


@pytest.mark.parametrize(
    "proposer, kind, sources",
    [
        (Unknown(free=True), FreeDrafting, ("lookup",)),
        (Unknown(free=False), ModelDrafting, ("draft",)),
        (Pair(), AutoDrafting, ("lookup", "draft")),
    ],
)
def test_planning_follows_the_protocol_not_the_class(proposer, kind, sources):
    drafting = drafting_for(proposer, SpeculationConfig(), None, None, lambda: 0.0)
    assert type(drafting) is kind and drafting.sources == sources
