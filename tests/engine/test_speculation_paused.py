"""'Speculation paused' says the adaptive policy predicted plain decoding faster. It must never be
said because an answer's last tokens left no room to draft (the token budget caps the draft length)."""

import pytest

from engine.decoding import threads
from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig
from engine.lab.bench import read_prompts
from engine.paths import resources_dir

from support.step_costs import pin_step_costs

GREEDY = SamplingParams(temperature=0.0)


def copying_prompt() -> str:
    items = read_prompts(resources_dir() / "prompts" / "grounded.jsonl")
    return next(p["prompt"] for p in items if p["id"] == "copy-passage")


def answer(decoder: SpeculativeDecoder, prompt: list[int], max_tokens: int) -> list[tuple[bool, int]]:
    """(paused, the policy's draft length) as the stats panel sees them after each delta (the first
    delta is the prompt's own token, before any step chose a length)."""
    trace = []
    for _ in decoder.generate(prompt, GREEDY, max_tokens=max_tokens, ignore_eos=True):
        trace.append((decoder.stats.speculation_paused, decoder.stats.policy_draft_length))
    return trace


@pytest.mark.slow
def test_the_token_budget_capping_the_last_drafts_is_not_reported_as_paused(target, monkeypatch):
    pin_step_costs(monkeypatch, one_row_s=0.010, extra_row_s=0.0005)  # verified rows nearly free: drafting pays
    decoder = SpeculativeDecoder(target, LookupProposer(), SpeculationConfig(max_draft=8, adaptive=True))
    prompt = target.tokenize(copying_prompt())
    answer(decoder, prompt, 32)  # the policy learns that drafting pays on this copying text
    assert decoder.stats.speculative_steps > 0
    for budget in (2, 3, 5):  # 2: the only step has room for no draft at all
        trace = answer(decoder, prompt, budget)
        assert decoder.stats.generated == budget
        assert not decoder.stats.speculation_paused, (budget, trace)
        assert not any(paused for paused, _ in trace), (budget, trace)  # no room is no prediction


@pytest.mark.slow
def test_the_policy_choosing_plain_decoding_is_reported_as_paused(target, monkeypatch):
    pin_step_costs(monkeypatch, one_row_s=0.010, extra_row_s=0.010)  # every verified row costs a whole step
    # No trial of fewer threads within these 24 tokens: the step after a switch measures, it predicts nothing.
    monkeypatch.setattr(threads, "FIRST_QUIET_TRIAL_AFTER", 10**6)
    decoder = SpeculativeDecoder(target, LookupProposer(), SpeculationConfig(max_draft=8, adaptive=True))
    trace = answer(decoder, target.tokenize(copying_prompt()), 24)
    assert decoder.stats.speculation_paused and decoder.stats.policy_draft_length == 0, trace
    # Step costs were calibrated before the first step, so every plain choice is a prediction. A step with no
    # proposal has no choice and keeps the last verdict: where the answer opens with '"' (Gemma 3 on some CPUs),
    # which the prompt does not hold, the first step has none and the verdict comes with the second.
    first = next(i for i, (paused, _) in enumerate(trace) if paused)
    assert first <= 2 and all(paused == (chosen == 0) for paused, chosen in trace[first:]), trace


def test_a_plain_step_with_no_room_for_a_draft_is_not_called_a_prediction(target):
    """A two-token answer: after the prompt's own token, one step with room for no draft, not 'paused'."""
    decoder = SpeculativeDecoder(target, LookupProposer())
    list(
        decoder.generate(
            target.tokenize("One two three one two three one two"), SamplingParams(temperature=0), max_tokens=2
        )
    )
    assert decoder.stats.policy_draft_length == 0 and not decoder.stats.speculation_paused
