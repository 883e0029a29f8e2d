"""--method auto: prompt lookup and a draft model offered every step, one chosen per sequence and step.

The real Gemma 3 270M is the target and a second copy of it the draft; step and draft costs are pinned (as in
test_draft_path), so what is chosen follows the real acceptance and the pinned machine, not what else runs."""

import pytest

from engine.decoding.drafting import DRAFT_FEATURE
from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.loader import DecoderSettings, make_proposer
from engine.decoding.proposers.auto import AutoProposer
from engine.decoding.proposers.draft_model import DraftModelProposer
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig
from engine.decoding.step import StepLoop
from engine.errors import InvalidSettingError

from support.step_costs import ONE_ROW_S, pin_draft_costs, pin_step_costs

GREEDY = SamplingParams(temperature=0.0)
OPEN = "The best way to spend three days in Kyoto is"  # nothing to copy: the draft's to guess
COPY = (
    "Passage: The lighthouse at Point Arden was built in 1871 from granite quarried on the island itself. "
    "For ninety years its keepers climbed one hundred and twelve steps every evening to light the lamp.\n\n"
    "The same passage, copied word for word:\nPassage: The lighthouse at"
)


@pytest.fixture
def draft(gemma_draft):
    return gemma_draft  # the session's (tests/engine/conftest.py)


def run_traced(target, draft, monkeypatch, draft_token_s: float):
    """Greedy answers to OPEN, then COPY, as one chat with --method auto on GPU-like pinned step costs (extra rows
    nearly free) and a draft token pinned at draft_token_s; returns the decoder, and for each answer its tokens
    and per step (lookup tokens verified, draft tokens verified, rows the draft model decoded proposing)."""
    pin_step_costs(monkeypatch, one_row_s=ONE_ROW_S, extra_row_s=0.02 * ONE_ROW_S)
    pin_draft_costs(monkeypatch, draft_token_s)
    decoder = SpeculativeDecoder(
        target,
        AutoProposer(LookupProposer(), DraftModelProposer(draft, target, p_min=0.0)),
        SpeculationConfig(max_draft=8),
    )
    decoder.calibrate()
    draft_rows = []
    real_decode = draft.decode_multi
    monkeypatch.setattr(
        draft, "decode_multi", lambda tokens, *a, **k: draft_rows.append(len(tokens)) or real_decode(tokens, *a, **k)
    )
    steps = []
    real_propose = StepLoop._propose

    def traced(loop, active, *args):
        draft_rows.clear()
        chosen = real_propose(loop, active, *args)
        p = chosen[0]
        steps.append(
            (0 if p.source == "draft" else len(p.tokens), len(p.tokens) if p.source == "draft" else 0, sum(draft_rows))
        )
        return chosen

    monkeypatch.setattr(StepLoop, "_propose", traced)
    answers = []
    for text in (OPEN, COPY):
        steps = []
        out = [
            t for d in decoder.generate(target.tokenize(text), GREEDY, max_tokens=40, ignore_eos=True) for t in d.tokens
        ]
        answers.append((out, steps))
    return decoder, answers


@pytest.mark.slow
def test_auto_copies_with_lookup_guesses_with_the_draft_and_never_runs_the_draft_on_a_copy(target, draft, monkeypatch):
    decoder, [(open_out, open_steps), (copy_out, copy_steps)] = run_traced(target, draft, monkeypatch, 0.1 * ONE_ROW_S)
    assert len(open_out) == len(copy_out) == 40 and decoder.stats.method == "auto"
    guessed = [s for s in open_steps if s[1]]
    assert sum(s[1] for s in guessed) >= 16, open_steps  # nothing to copy: the draft (= target) guessed
    copied = [s for s in copy_steps if s[0]]
    assert sum(s[0] for s in copied) >= 24, copy_steps  # the passage came from lookup's copies ...
    assert all(rows == 0 for _, _, rows in copied), copy_steps  # ... and the draft model did not decode for them
    assert decoder.loop.draft_planner is not decoder.loop.planner
    assert decoder.loop.draft_planner.acceptance.mean_acceptance(DRAFT_FEATURE)[0] > 0.5  # draft = target


@pytest.mark.slow
def test_auto_with_a_draft_that_cannot_pay_is_lookup_alone(target, draft, monkeypatch):
    """A draft token as dear as a target step can never pay (test_draft_path): auto then never drafts with it,
    and its copies are lookup's."""
    decoder, answers = run_traced(target, draft, monkeypatch, draft_token_s=1.0 * ONE_ROW_S)
    steps = [s for _, answer_steps in answers for s in answer_steps]
    assert not any(s[1] or s[2] for s in steps), steps
    assert sum(s[0] for s in steps) >= 24


def test_auto_needs_a_draft_model_and_says_so():
    with pytest.raises(InvalidSettingError, match="auto method needs a draft model"):
        DecoderSettings(method="auto")


def test_auto_proposer_is_built_from_settings(target, draft):
    proposer = make_proposer(DecoderSettings(method="auto", draft="x"), target, draft)
    assert isinstance(proposer, AutoProposer) and proposer.name == "auto"
    assert isinstance(proposer.lookup, LookupProposer) and [d.model for d in proposer.drafters] == [draft]


@pytest.mark.slow
def test_with_fixed_lengths_auto_guesses_with_the_draft_where_lookup_has_no_copy(target, draft):
    """adaptive off (Settings' check box): no plan bets on anything, yet the draft still guesses where lookup offers
    nothing (it never did before this was fixed: only rate-bearing plans could win over lookup's empty one)."""
    decoder = SpeculativeDecoder(
        target,
        AutoProposer(LookupProposer(), DraftModelProposer(draft, target, p_min=0.0)),
        SpeculationConfig(max_draft=4, adaptive=False),
    )
    for _ in decoder.generate(target.tokenize(OPEN), GREEDY, max_tokens=24, ignore_eos=True):
        pass
    assert decoder.loop.draft_planner.acceptance.mean_acceptance(DRAFT_FEATURE)[0] > 0.5
    assert decoder.stats.accepted >= 8, decoder.stats.to_dict()


def test_auto_proposes_on_its_own_as_any_proposer_does(target, draft):
    """Asked directly (the Proposer interface, unplanned): lookup's copy where the history repeats, else the draft
    model's guess, which for a draft that is the target's own copy starts with the target's greedy token."""
    import torch

    proposer = AutoProposer(LookupProposer(), DraftModelProposer(draft, target, p_min=0.0))
    copy, fresh = target.tokenize(COPY), target.tokenize(OPEN)
    proposer.start(0, copy, GREEDY, torch.device("cpu"), 1)
    copied = proposer.propose([(0, copy, 4)])[0]
    assert copied.tokens and copied.source == "lookup"  # "The lighthouse at" is in the prompt: copied
    proposer.start(0, fresh, GREEDY, torch.device("cpu"), 1)
    guessed = proposer.propose([(0, fresh, 4)])[0]
    assert guessed.tokens and guessed.source == "draft"
    plain = SpeculativeDecoder(target)
    first = next(iter(plain.generate(fresh, GREEDY, max_tokens=1, ignore_eos=True))).tokens
    assert guessed.tokens[:1] == first
