"""The chat's draft-model path with the real model, draft = target (a separate copy of the same file):
adaptive mode turns speculation off when the draft never stops on its own, and the draft's prompt
processing does not delay the first token."""

import time
from types import SimpleNamespace

import pytest

import engine.decoding.proposers.draft_model as draft_model_module
from engine.decoding.draft_planner import HORIZON_FLOOR, PROBE_SHARE, DraftPlanner
from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.proposers.draft_model import DraftModelProposer
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig

from support.step_costs import ONE_ROW_S, pin_draft_costs, pin_step_costs

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "The best way to spend three days in Kyoto is"

# Target step cost by rows verified, as a multiple of a 1-row step: measured on this 2-core machine
# (engine/draft_policy.py). A multi-row step costs more than the square-root law the policy guesses
# with, so a plain step guessed from long verifies alone looks dearer than it is.
STEP_COST = {1: 1.0, 2: 2.1, 3: 3.6, 13: 7.4, 17: 9.1}


@pytest.fixture
def draft(gemma_draft):
    return gemma_draft  # the session's (tests/engine/conftest.py)


@pytest.mark.slow
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
    pin_draft_costs(monkeypatch, ONE_ROW_S)
    decoder = SpeculativeDecoder(
        target, DraftModelProposer(draft, target, p_min=0.0), SpeculationConfig(max_draft=16, adaptive=True)
    )
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


@pytest.mark.slow
def test_a_draft_that_can_pay_is_used_from_the_start(target, draft, monkeypatch):
    """The same draft, timed as if it were 20x cheaper than the target, on a target whose extra verified
    rows cost 10% of a step (a GPU's figure): it drafts from the first steps (the planner knows its cost
    before any draft runs) and, being the target itself, is nearly always right."""
    pin_step_costs(monkeypatch, one_row_s=ONE_ROW_S, extra_row_s=ONE_ROW_S / 10)
    pin_draft_costs(monkeypatch, ONE_ROW_S / 20)
    decoder = SpeculativeDecoder(
        target, DraftModelProposer(draft, target, p_min=0.0), SpeculationConfig(max_draft=16, adaptive=True)
    )
    decoder.calibrate()
    lengths = []
    for _ in decoder.generate(target.tokenize(PROMPT), GREEDY, max_tokens=64, ignore_eos=True):
        lengths.append(decoder.stats.draft_length)
    assert any(lengths[:3]), lengths
    # The draft is the target, so most of its tokens are kept. Not all: a verify of several rows rounds differently
    # from the draft's one-row decodes, so the two part at near-ties, by how much depends on the CPU's kernels
    # (0.86 on one machine, 0.79 on another with AVX-512). Half is far from any of them, and far above a draft
    # that was not the target's equal.
    assert decoder.stats.accepted > 0 and decoder.stats.acceptance_rate > 0.5


@pytest.mark.slow
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
    decoder = SpeculativeDecoder(
        target, DraftModelProposer(draft, target, p_min=0.0), SpeculationConfig(max_draft=4, adaptive=False)
    )
    for delta in decoder.generate(prompt, GREEDY, max_tokens=8, ignore_eos=True):
        deltas.append(delta)
    prompt_prefill = next(p for p in prefills if p[1] >= len(prompt) - 1)
    assert prompt_prefill[0] >= 1, prefills  # the first delta was out before the draft saw the prompt
    assert decoder.stats.draft_s >= sum(seconds for _, _, seconds in prefills)
    assert decoder.stats.drafted > 0


@pytest.mark.slow
def test_the_drafts_catch_up_is_timed_apart_from_its_tokens(target, draft, monkeypatch):
    """A draft's first proposal processes the whole prompt. That time is the catch-up's, kept apart: folded into
    the proposal's two tokens, it priced the real 0.5B draft of Qwen2.5-Coder-1.5B as hopeless for good. Here
    the draft's prompt processing is made an hour slower on a fake clock (the real one plus what the slowed prefill
    adds); none of that reaches the drafted tokens' time."""
    slow, added = 3600.0, [0.0]
    real_prefill = draft.prefill

    def fake_clock() -> float:
        return time.perf_counter() + added[0]

    def slowed_prefill(*a, **k):
        added[0] += slow
        return real_prefill(*a, **k)

    monkeypatch.setattr(draft, "prefill", slowed_prefill)
    monkeypatch.setattr(draft_model_module, "time", SimpleNamespace(perf_counter=fake_clock))
    drafts, catch_ups = [], []
    record_draft, record_catch_up = DraftPlanner.record_draft, DraftPlanner.record_catch_up
    monkeypatch.setattr(
        DraftPlanner,
        "record_draft",
        lambda self, tokens, seconds: drafts.append((tokens, seconds)) or record_draft(self, tokens, seconds),
    )
    monkeypatch.setattr(
        DraftPlanner,
        "record_catch_up",
        lambda self, rows, seconds: catch_ups.append((rows, seconds)) or record_catch_up(self, rows, seconds),
    )
    draft.forget_all()
    prompt = target.tokenize(PROMPT + " Kyoto, the old capital, has temples, gardens and markets." * 6)
    decoder = SpeculativeDecoder(
        target, DraftModelProposer(draft, target, p_min=0.0), SpeculationConfig(max_draft=4, adaptive=False)
    )
    decoder.loop.clock = decoder.loop.drafting.clock = fake_clock
    for _ in decoder.generate(prompt, GREEDY, max_tokens=8, ignore_eos=True):
        pass
    first = next(i for i, (rows, _) in enumerate(catch_ups) if rows)
    rows, seconds = catch_ups[first]
    assert rows == len(prompt) and seconds >= slow, catch_ups  # the prompt, and the time it took
    assert drafts[first][0] == 4 and drafts[first][1] < slow, drafts  # its tokens' time without it
    assert decoder.stats.draft_s >= slow  # still drafting time in the answer's figures


def test_a_draft_is_probed_only_where_the_answer_can_repay_its_catch_up():
    """The real pair's costs on this CPU (Qwen2.5-Coder 1.5B + 0.5B: a draft token 0.41 of a target step, a row of
    prompt processing 0.05, verifying 3 rows 2.04 steps). Behind by a 600-token prompt, the draft's first probe
    would cost 30 steps: a 300-token answer never pays that, so it is never probed. Caught up, a probe costs about
    two steps, made once the answer has gone on long enough for that to be 2% of what is still to come."""
    feature = ("draft",)

    def probes(lag: int) -> list[int]:
        planner = DraftPlanner(SpeculationConfig(max_draft=4), costly_proposer=True)
        planner.steps.take_calibration({1: 0.010, 2: 0.0157, 3: 0.0204, 4: 0.0216, 8: 0.051})
        planner.record_draft(1, 0.0041)
        planner.record_catch_up(1, 0.0005)
        made = []
        for generated in range(300):
            lengths = planner.plan(
                [feature], [4], lags=[lag + generated if lag else 0], horizon=[max(generated, HORIZON_FLOOR)]
            ).lengths
            if any(lengths):
                made.append(generated)
            planner.record_step(1 + sum(lengths), sum(lengths), planner.steps.seconds(1 + sum(lengths)))
        return made

    assert probes(600) == []
    caught_up = probes(0)
    assert caught_up and min(caught_up) >= 90, caught_up


def test_an_answers_probes_together_cost_at_most_their_share_of_it():
    """The real pair's costs again but a GPU-like catch-up (a row a two-hundredth of a step), a draft whose probes are
    never kept (an open question): each probe alone is within PROBE_SHARE of what is still to come, and so are all of
    them together (one budget per answer, as drafting.py charges it). Charged alone, this answer probed 5 times and
    paid 2.8% of its plain time. The draft lags by what the answer wrote since its last probe."""
    feature = ("draft",)
    planner = DraftPlanner(SpeculationConfig(max_draft=4), costly_proposer=True)
    planner.steps.take_calibration({1: 0.010, 2: 0.0157, 3: 0.0204, 4: 0.0216, 8: 0.051})
    planner.record_draft(1, 0.0041)
    planner.record_catch_up(1, 0.00005)
    probed_s, probes, tokens, caught = 0.0, [], 400, 0
    for generated in range(tokens):
        plan = planner.plan(
            [feature], [4], lags=[generated - caught], horizon=[max(generated, HORIZON_FLOOR)], probed_s=[probed_s]
        )
        k = plan.lengths[0]
        if k:
            probes.append(generated)
            probed_s += plan.probe_s
            caught = generated
            planner.acceptance.record(feature, k, 0)
        planner.record_step(1 + k, k, planner.steps.seconds(1 + k))
    assert len(probes) >= 2, probes  # it keeps probing, less often
    assert probed_s <= PROBE_SHARE * tokens * planner.steps.seconds(1), (probes, probed_s)


def test_a_bet_on_the_draft_must_repay_its_catch_up_within_the_answer():
    """Where rows are nearly free and the draft is kept, drafting pays by itself; behind by 2,000 tokens, it still
    pays for a long answer, not for one expected to end within 32 tokens."""
    feature = ("draft",)
    planner = DraftPlanner(SpeculationConfig(max_draft=4), costly_proposer=True)
    planner.steps.take_calibration({1: 0.010, 2: 0.0105, 4: 0.011, 8: 0.012})
    planner.record_draft(1, 0.001)
    planner.record_catch_up(1, 0.0002)
    for _ in range(20):
        planner.acceptance.record(feature, 4, 4)
    assert any(planner.plan([feature], [4], lags=[0], horizon=[32]).lengths)
    assert any(planner.plan([feature], [4], lags=[2000], horizon=[2000]).lengths)
    assert not any(planner.plan([feature], [4], lags=[2000], horizon=[32]).lengths)


def test_a_catch_up_timed_dearer_than_a_draft_token_counts_as_one():
    """A batched catch-up row costs no more than a one-row decode: one timed dearer (a busy spell: 3 of the
    target's steps a row, in CI) is taken at the token's cost, or the draft's catch-up never looks repaid."""
    from engine.decoding.drafting import ModelDrafting

    class BusyTiming:
        free = False

        def time_draft(self, slot):
            return 0.004, 0.03  # a token, and a catch-up row timed while something else ran

    planner = DraftPlanner(SpeculationConfig(max_draft=4), costly_proposer=True)
    planner.steps.take_calibration({1: 0.010, 2: 0.0157, 4: 0.0216})
    ModelDrafting(BusyTiming(), planner, None, SpeculationConfig(max_draft=4), time.perf_counter).time_draft(0)
    assert planner.catch_up_seconds(10) == pytest.approx(10 * 0.004)


def test_a_drafts_one_row_step_is_timed_afresh_not_taken_from_a_busy_spells_kept_timing(target, draft):
    """The day's kept timings spare a reload the calibration; but a draft token kept from a busy spell made the draft
    look hopeless, and a hopeless draft never drafts, so nothing corrected it. Its one-row step is timed at each
    calibration (the catch-up's wide step stays kept)."""
    draft.step_timings[(draft.threads, 1)] = 10.0  # kept from a spell when the machine crawled
    token_s, _ = DraftModelProposer(draft, target).time_draft(0)
    assert token_s < 10.0
    assert draft.step_timings[(draft.threads, 1)] == token_s  # the fresh timing is kept in its place
