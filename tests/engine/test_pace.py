"""speedup_vs_plain and the guard (engine/decoding/pace.py): the plain step time is learnt from plain steps by
position, and an answer whose drafted steps cost more than plain decoding would have is held plain, the stats
saying so; on the real model, a verify made slow on purpose trips the guard and the estimate says below plain."""

import time

import pytest

from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.pace import GUARD_BACKOFF_STEPS, GUARD_MIN_TOKENS, GUARD_WINDOW, PlainPace, SequencePace
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig

pytestmark = pytest.mark.slow  # a guard tripped on the real model

GREEDY = SamplingParams(temperature=0.0)
COPY = (
    "Passage: The lighthouse at Point Arden was built in 1871 from granite quarried on the island itself. "
    "For ninety years its keepers climbed one hundred and twelve steps every evening to light the lamp.\n\n"
    "The same passage, word for word:\nPassage: The lighthouse"
)


def test_a_plain_step_is_predicted_from_fresh_plain_steps_and_grows_with_the_context():
    pace = PlainPace()
    assert pace.predict(1, 2, 100, fallback=0.005, now=0) == 0.005  # nothing seen yet: the calibrated time
    for i, position in enumerate(range(0, 400, 10)):
        pace.record(1, 2, position, 0.009 + 0.00002 * position, now=i * 0.01)  # 9 ms at 0, 17 ms at 400
    at_390 = pace.predict(1, 2, 390, None, now=1)
    assert abs(at_390 - (0.009 + 0.00002 * 390)) < 0.001
    assert pace.predict(1, 2, 200, None, now=1) < at_390  # earlier in the context: faster
    assert pace.predict(1, 2, 10_000, None, now=1) < 0.009 + 0.00002 * 800  # never read far beyond the samples
    assert pace.predict(1, 2, 200, fallback=0.004, now=100) == 0.004  # a minute later: stale, not now's pace
    assert pace.predict(1, 1, 200, fallback=None, now=1) is None  # another thread count: not these steps
    pace.record(1, 1, 0, 0.02, now=1)
    assert pace.predict(1, 2, 200, fallback=0.004, now=1) == 0.004  # the count changed: forgotten


def test_the_level_follows_the_machine_now():
    pace = PlainPace()
    for i in range(40):
        pace.record(1, 2, 100, 0.030, now=i * 0.01)  # busy: 30 ms a step
    for i in range(8):
        pace.record(1, 2, 100, 0.010, now=1 + i * 0.01)  # quiet again: 10 ms
    assert abs(pace.predict(1, 2, 100, None, now=2) - 0.010) < 1e-9


def test_the_guard_holds_an_answer_that_runs_below_plain_and_says_so():
    pace = SequencePace()
    for _ in range(GUARD_WINDOW):
        pace.record(actual=0.010, plain=0.012, drafted=True, tokens=4)  # 1.2x plain: nothing to do
    assert not pace.holding and pace.note is None and abs(pace.speedup - 1.2) < 1e-9
    slow_steps = 0
    while not pace.holding:
        pace.record(actual=0.020, plain=0.012, drafted=True, tokens=4)  # 0.6x plain
        slow_steps += 1
    assert slow_steps <= GUARD_MIN_TOKENS  # within a window of the slowdown
    ratio = float(pace.note.removeprefix("backed off: ran at ").removesuffix("× plain"))
    assert ratio < 0.95
    held = 0
    while pace.holding:
        pace.record(actual=0.012, plain=0.012, drafted=False)
        held += 1
    assert held == GUARD_BACKOFF_STEPS
    while not pace.holding:
        pace.record(actual=0.030, plain=0.012, drafted=True, tokens=4)
    assert pace.plain_steps_left == 2 * GUARD_BACKOFF_STEPS and "(2 times)" in pace.note  # longer each time


def test_an_answer_well_ahead_of_plain_is_not_held_for_one_slow_window():
    """A copy ending costs a window below plain; an answer ahead overall keeps speculating (the planner answers
    that), and is held once the answer as a whole has fallen to plain."""
    pace = SequencePace()
    for _ in range(40):
        pace.record(actual=0.010, plain=0.020, drafted=True, tokens=4)  # a copy: 2x plain
    for _ in range(GUARD_WINDOW):
        pace.record(actual=0.020, plain=0.012, drafted=True, tokens=2)  # its end: a window at 0.6x
    assert not pace.holding and pace.speedup > 1.0
    while not pace.holding:
        pace.record(actual=0.020, plain=0.012, drafted=True, tokens=2)
    assert pace.speedup <= 1.0 and pace.note.startswith("backed off")


def test_plain_steps_alone_never_trip_the_guard():
    pace = SequencePace()
    for _ in range(3 * GUARD_WINDOW):
        pace.record(actual=0.030, plain=0.012, drafted=False)  # slow, but nothing was drafted
    assert not pace.holding and pace.note is None


def test_on_the_real_model_a_verify_made_slow_trips_the_guard(target):
    decoder = SpeculativeDecoder(target, LookupProposer(), SpeculationConfig(max_draft=8))
    prompt = target.tokenize(COPY)
    [tok for d in decoder.generate(prompt, GREEDY, max_tokens=48, ignore_eos=True) for tok in d.tokens]
    fair = decoder.stats
    assert fair.drafted > 0 and fair.speedup_vs_plain is not None

    real = target.decode_multi

    def slow(tokens, *args, **kwargs):  # every multi-row verify costs 0.3 s more: speculation cannot pay
        if len(tokens) > 1:
            time.sleep(0.3)
        return real(tokens, *args, **kwargs)

    target.decode_multi = slow
    try:
        decoder.loop.planner.steps.take_calibration({1: 0.005, 2: 0.0055, 9: 0.007})  # the planner is fooled
        out = [tok for d in decoder.generate(prompt, GREEDY, max_tokens=64, ignore_eos=True) for tok in d.tokens]
    finally:
        target.decode_multi = real
    slowed = decoder.stats
    assert len(out) == 64
    assert slowed.guard and slowed.guard.startswith("backed off") and "× plain" in slowed.guard
    assert slowed.speculative_steps < slowed.verify_steps / 2  # held plain for most of the answer
