"""The chat's adaptive mode (SpeculativeDecoder, prompt lookup, adaptive on) with the real model:
speculation stays on while an answer copies its prompt, backs off on open-ended text, and the live
stats say when it changed."""

from dataclasses import dataclass

import pytest

from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig
from engine.lab.bench import read_prompts
from engine.paths import resources_dir

from support.step_costs import pin_step_costs

GREEDY = SamplingParams(temperature=0.0)
TOKENS = 48


@dataclass(frozen=True)
class Snapshot:
    """The live stats as the chat's stats panel sees them after each delta."""

    generated: int
    paused: bool
    speculative_steps: int
    verify_steps: int


def prompt(set_name: str, prompt_id: str) -> str:
    items = read_prompts(resources_dir() / "prompts" / f"{set_name}.jsonl")
    return next(p["prompt"] for p in items if p["id"] == prompt_id)


def answer(decoder: SpeculativeDecoder, text: str, tokens: int = TOKENS) -> list[Snapshot]:
    trace = []
    for _ in decoder.generate(decoder.target.tokenize(text), GREEDY, max_tokens=tokens, ignore_eos=True):
        s = decoder.stats
        trace.append(Snapshot(s.generated, s.speculation_paused, s.speculative_steps, s.verify_steps))
    return trace


def compact(trace: list[Snapshot]) -> str:
    """tokens:P(aused)/-:speculative steps so far, per delta: readable in a failure message."""
    return " ".join(f"{s.generated}:{'P' if s.paused else '-'}:{s.speculative_steps}" for s in trace)


def paused_from(trace: list[Snapshot]) -> int | None:
    """Tokens generated when speculation went off for the rest of the answer (None: it did not)."""
    if not trace[-1].paused:
        return None
    i = len(trace) - 1
    while i > 0 and trace[i - 1].paused:
        i -= 1
    return trace[i].generated


# Cost of one target step by rows verified (logits on every row), as a multiple of a 1-row step, on
# this 2-core CPU: DESIGN.md's measurements, plus 2 rows measured at 2.0x for this test. The policy
# sees these instead of live timings, so its decisions do not depend on what else the machine runs;
# the acceptance it reacts to is the real model's.
STEP_COST = {1: 1.0, 2: 2.0, 3: 2.1, 5: 3.5, 9: 5.1, 17: 6.6, 33: 10.3}


@pytest.fixture
def adaptive_lookup(target, monkeypatch):
    pin_step_costs(monkeypatch, STEP_COST)
    return SpeculativeDecoder(target, LookupProposer(), SpeculationConfig(max_draft=8, adaptive=True))


@pytest.mark.slow
def test_speculation_stays_on_while_the_answer_copies_the_prompt(adaptive_lookup):
    trace = answer(adaptive_lookup, prompt("grounded", "copy-passage"))
    stats = adaptive_lookup.stats
    assert stats.generated == TOKENS
    on_at = next((t.generated for t in trace if t.speculative_steps), None)
    assert on_at is not None and on_at <= 16, trace  # earned in the shadow within a few tokens
    assert paused_from(trace) is None, trace  # and still on at the end
    # Part of the answer came from accepted drafts, so the target ran fewer steps than tokens. How much varies even
    # with step costs pinned: runs keep 0.4 of the tokens or more, but one full-suite run here kept 12 of 48 (all it
    # drafted: the drafts were short). What else the planner reads that moved it is not traced yet (issue 64).
    assert stats.accepted >= 0.2 * stats.generated
    assert stats.verify_steps <= 0.8 * stats.generated


@pytest.mark.slow
def test_speculation_stays_off_on_open_text_and_the_stats_say_so(adaptive_lookup):
    trace = answer(adaptive_lookup, prompt("open", "travel"))
    stats = adaptive_lookup.stats
    # Off, and said so, but for a rare step where a long enough match predicts a gain. After such a step the
    # stats keep saying "on" until the planner next turns a proposal down (a step with nothing proposed has no
    # choice to report), and steps that measure plain decoding say "on" too, so "paused" shows on most deltas,
    # not all: 29 of 46 where the answer ended in a kept two-token copy, 35 of 46 where it did not (the weights'
    # layout chose between those answers, at a near-tie).
    assert sum(s.paused for s in trace) >= 0.6 * len(trace), compact(trace)
    assert stats.speculative_steps <= 0.25 * stats.verify_steps, (stats.speculative_steps, stats.verify_steps)


@pytest.mark.slow
def test_speculation_backs_off_when_the_conversation_turns_open(adaptive_lookup):
    """The planner is kept across responses (as in the chat): after a copying answer, open-ended text
    must turn speculation (mostly) off within the answer."""
    answer(adaptive_lookup, prompt("grounded", "copy-passage"))
    trace = answer(adaptive_lookup, prompt("open", "travel"))
    start = len(trace) // 3
    later = trace[start:]
    # Off: the planner paused it, or the step drafted nothing (the guard holds an answer that ran below plain)
    off = [s.paused or s.speculative_steps == before.speculative_steps for before, s in zip(trace[start - 1 :], later)]
    assert sum(off) >= 0.75 * len(later), compact(trace)
    stats = adaptive_lookup.stats  # (its last steps may keep a drafted step's verdict: no room to choose)
    assert stats.speculative_steps <= 0.25 * stats.verify_steps, compact(trace)
