"""The chat's draft-model path with the real model, draft = target (a separate copy of the same file):
adaptive mode turns speculation off when the draft never stops on its own, and the draft's prompt
processing does not delay the first token."""
import time

import pytest

from engine.decoding.cost_model import DraftPlanner, SpeculationConfig
from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.proposers.draft_model import DraftModelProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams

from step_costs import ONE_ROW_S, pin_step_costs

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "The best way to spend three days in Kyoto is"

# Target step cost by rows verified, as a multiple of a 1-row step: measured on this 2-core machine
# (engine/draft_policy.py). A multi-row step costs more than the square-root law the policy guesses
# with, so a plain step guessed from long verifies alone looks dearer than it is.
STEP_COST = {1: 1.0, 2: 2.1, 3: 3.6, 13: 7.4, 17: 9.1}


@pytest.fixture(scope="module")
def draft(model_path):
    model = Model(model_path, LoadSettings(n_ctx=2048, threads=2))
    yield model
    model.close()


def test_a_draft_that_never_stops_is_switched_off_when_it_cannot_pay(target, draft, monkeypatch):
    """p_min 0: the draft always drafts the full length, so no step is plain unless the policy makes
    one. A draft as costly as the target can never pay: each drafted token costs a 1-row step of the
    same model, so even with every draft accepted a step of k drafts yields k+1 tokens for more than
    k+1 one-row steps. The policy sees the DESIGN.md step costs and that draft cost instead of live
    timings (as in test_auto_mode), so the decision does not depend on what else the machine runs.
    The draft's token is timed with the target's steps, before the first answer, so the draft never
    runs: no probe, and no prompt processing that the answer's tokens/s would pay for (it did: 16% off
    the first answer of draft = target on SmolLM2)."""
    pin_step_costs(monkeypatch, STEP_COST)
    record_draft = DraftPlanner.record_draft
    monkeypatch.setattr(DraftPlanner, "record_draft",
                        lambda self, tokens, seconds: record_draft(self, tokens, ONE_ROW_S * tokens))
    decoder = SpeculativeDecoder(target, DraftModelProposer(draft, target, p_min=0.0),
                                 SpeculationConfig(max_draft=16, adaptive=True))
    decoder.calibrate()  # times the draft's token too: those decodes are not proposals
    assert decoder.loop.planner.draft_timed
    draft_decodes = []
    real_decode = draft.decode_multi
    monkeypatch.setattr(draft, "decode_multi", lambda *a, **k: draft_decodes.append(1) or real_decode(*a, **k))
    lengths, paused = [], []  # the draft length of the step behind each delta, and what the stats said
    for _ in decoder.generate(target.tokenize(PROMPT), GREEDY, max_tokens=64, ignore_eos=True):
        lengths.append(decoder.stats.draft_length)
        paused.append(decoder.stats.speculation_paused)
    stats = decoder.stats
    assert stats.generated == 64
    assert not any(lengths) and stats.speculative_steps == 0, lengths
    assert not draft_decodes  # the draft model never decoded a row for a proposal
    assert stats.speculation_paused, paused


def test_a_draft_that_can_pay_is_used_from_the_start(target, draft, monkeypatch):
    """The same draft, timed as if it were 20x cheaper than the target, on a target whose extra verified
    rows cost 10% of a step (a GPU's figure): it drafts from the first steps (the planner knows its cost
    before any draft runs) and, being the target itself, is nearly always right."""
    pin_step_costs(monkeypatch, one_row_s=ONE_ROW_S, extra_row_s=ONE_ROW_S / 10)
    record_draft = DraftPlanner.record_draft
    monkeypatch.setattr(DraftPlanner, "record_draft",
                        lambda self, tokens, seconds: record_draft(self, tokens, ONE_ROW_S / 20 * tokens))
    decoder = SpeculativeDecoder(target, DraftModelProposer(draft, target, p_min=0.0),
                                 SpeculationConfig(max_draft=16, adaptive=True))
    decoder.calibrate()
    lengths = []
    for _ in decoder.generate(target.tokenize(PROMPT), GREEDY, max_tokens=64, ignore_eos=True):
        lengths.append(decoder.stats.draft_length)
    assert any(lengths[:3]), lengths
    assert decoder.stats.acceptance_rate > 0.9


def test_the_first_token_does_not_wait_for_the_drafts_prompt(target, draft, monkeypatch):
    """The first token comes from the target's prefill alone; the draft processes the prompt after it is
    out, and that time still counts as drafting."""
    deltas, prefills = [], []  # prefills: (deltas already yielded, rows, seconds) per draft decode

    def watched(real_decode):
        def watched_decode(tokens, *args, **kwargs):
            t = time.perf_counter()
            out = real_decode(tokens, *args, **kwargs)
            prefills.append((len(deltas), len(tokens), time.perf_counter() - t))
            return out
        return watched_decode

    for name in ("decode", "decode_multi"):  # the prompt goes through decode, drafting through decode_multi
        monkeypatch.setattr(draft, name, watched(getattr(draft, name)))
    draft.forget_all()  # nothing of this prompt cached: the draft must process all of it
    prompt = target.tokenize(PROMPT)
    decoder = SpeculativeDecoder(target, DraftModelProposer(draft, target, p_min=0.0),
                                 SpeculationConfig(max_draft=4, adaptive=False))
    for delta in decoder.generate(prompt, GREEDY, max_tokens=8, ignore_eos=True):
        deltas.append(delta)
    prompt_prefill = next(p for p in prefills if p[1] >= len(prompt) - 1)
    assert prompt_prefill[0] >= 1, prefills  # the first delta was out before the draft saw the prompt
    assert decoder.stats.draft_s >= sum(seconds for _, _, seconds in prefills)
    assert decoder.stats.drafted > 0
