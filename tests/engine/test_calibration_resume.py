"""A step timing says how far it is (timings done of all, and an estimate of the time left), can be cut short
without losing what it timed, goes on from there, and meanwhile answers plan on the sizes timed so far
(engine/decoding/calibration.py; the window's side: tests/app/test_calibration_progress.py)."""

from __future__ import annotations

import pytest

import engine.decoding.calibration as calibration
from engine.decoding import step_timings
from engine.decoding.calibration import CALIBRATION_WARMUP, calibrate_steps, seconds_left, timing_deferred
from engine.decoding.step_costs import StepCosts
from engine.errors import GenerationCancelled

MAX_DRAFT = 6  # sizes 1..7, each timed in two rounds: 14 timings


@pytest.fixture
def fresh(target, monkeypatch):
    """The session's Gemma with nothing timed (nothing saved either), and every timing it makes, in order. Its
    cache is emptied first: the timings decode from position 0, where an earlier test's kept cache may sit."""
    target.forget_all()
    monkeypatch.setattr(target, "step_timings", {})
    monkeypatch.setattr(step_timings, "save", lambda: None)
    timed: list[tuple[int, float]] = []
    real = calibration.time_decode

    def watched(model, slot, start, token, rows, clock):
        seconds = real(model, slot, start, token, rows, clock)
        timed.append((rows, seconds))
        return seconds

    monkeypatch.setattr(calibration, "time_decode", watched)
    yield timed
    target.set_interrupt(None)
    calibration._unfinished.pop(target, None)


def calibrate(target, steps, on_progress=None):
    calibrate_steps(target, steps, MAX_DRAFT, 0, 0, max(target.bos, 0), 1, False, on_progress=on_progress)


@pytest.mark.slow
def test_progress_counts_every_timing_from_the_first_to_the_last(target, fresh):
    reports = []
    steps = StepCosts()
    calibrate(target, steps, lambda *report: reports.append(report))
    assert steps.calibrated
    assert [done for done, _, _ in reports] == list(range(15))  # from 0, one by one
    assert {total for _, total, _ in reports} == {14}
    left = [seconds for _, _, seconds in reports]
    assert left[:3] == [None] * 3  # two sizes timed draw no line worth a figure: "n/a", not a guess
    assert all(seconds is not None and seconds > 0 for seconds in left[3:-1]) and left[-1] == 0


def test_the_time_left_is_estimated_from_what_each_timing_took(target, monkeypatch):
    """Each timing is priced at the time it took (here r ms for r rows, on a clock of the test's own), sizes not
    timed yet on the line through those timed."""
    monkeypatch.setattr(target, "step_timings", {})
    monkeypatch.setattr(step_timings, "save", lambda: None)
    now = [0.0]

    def decode(model, slot, start, token, rows, clock):
        now[0] += rows / 1000
        return rows / 1000

    monkeypatch.setattr(calibration, "time_decode", decode)
    reports = []
    calibrate_steps(
        target,
        StepCosts(),
        MAX_DRAFT,
        0,
        0,
        0,
        1,
        False,
        clock=lambda: now[0],
        on_progress=lambda *report: reports.append(report),
    )
    left = [seconds for _, _, seconds in reports]
    assert left[3] == pytest.approx((4 + 5 + 6 + 7 + sum(range(1, 8))) / 1000)  # 1-3 timed: 1 ms a row
    assert left[7] == pytest.approx(sum(range(1, 8)) / 1000)  # round one done: round two as it went


@pytest.mark.slow
def test_a_timing_cut_short_keeps_what_it_timed_and_the_next_goes_on_from_there(target, fresh):
    stop = []
    target.set_interrupt(lambda: bool(stop))
    reports = []

    def on_progress(done, total, left):
        reports.append(done)
        if done == 9:  # round two has timed sizes 1 and 2
            stop.append(True)

    position = target.next_position(0)
    with pytest.raises(GenerationCancelled):
        calibrate(target, StepCosts(), on_progress)
    assert target.next_position(0) == position  # the cut decode left nothing in the cache
    assert sorted(target.step_timings) == [(target.threads, 1), (target.threads, 2)]  # both rounds: kept
    target.set_interrupt(None)
    fresh.clear()
    reports.clear()
    steps = StepCosts()
    calibrate(target, steps, on_progress)
    assert steps.calibrated and len(target.step_timings) == 7
    timed = [rows for rows, _ in fresh[CALIBRATION_WARMUP + 1 :]]
    assert timed == [3, 4, 5, 6, 7]  # their second round only
    assert reports == list(range(9, 15))


@pytest.mark.slow
def test_an_answer_meanwhile_plans_on_the_sizes_timed_so_far_and_the_next_timing_completes_them(target, fresh):
    stop = []
    target.set_interrupt(lambda: bool(stop))
    with pytest.raises(GenerationCancelled):
        calibrate(target, StepCosts(), lambda done, total, left: done == 4 and stop.append(True))
    target.set_interrupt(None)
    part = dict(fresh[CALIBRATION_WARMUP + 1 :])
    assert sorted(part) == [1, 2, 3, 4] and target.step_timings == {}  # timed once each: none complete
    fresh.clear()
    steps = StepCosts()
    with timing_deferred(target):  # as the answer's steps call it
        calibrate(target, steps)
        calibrate(target, steps)
    assert fresh == []  # nothing timed while deferred
    assert steps.calibrated
    assert [steps.seconds(rows) for rows in part] == pytest.approx(list(part.values()))
    calibrate(target, steps)  # after the answer
    assert sorted(rows for rows, _ in fresh[CALIBRATION_WARMUP + 1 :]) == [1, 2, 3, 4, 5, 5, 6, 6, 7, 7]
    kept = {rows: seconds for (_, rows), seconds in target.step_timings.items()}
    assert sorted(kept) == list(range(1, 8))
    assert [steps.seconds(rows) for rows in range(1, 8)] == pytest.approx([kept[rows] for rows in range(1, 8)])


def test_the_servers_timed_only_curve_is_not_completed_while_it_serves(target, fresh):
    """timed_only (the server starts on the chat's timings) is not a deferral: its steps time nothing later."""
    target.step_timings.update({(target.threads, 1): 0.01, (target.threads, 2): 0.015})
    steps = StepCosts()
    calibrate_steps(target, steps, MAX_DRAFT, 0, 0, max(target.bos, 0), 1, True)
    calibrate(target, steps)
    assert steps.calibrated and fresh == []


def test_the_estimate_prices_sizes_not_yet_timed_on_the_line_through_those_timed():
    assert seconds_left({1: 0.010, 2: 0.020}, [3]) is None
    assert seconds_left({1: 0.010}, [1, 1]) == pytest.approx(0.020)
    # 10 ms + 5 ms a row: 4 and 5 rows on the line, 2 and 3 as measured.
    assert seconds_left({1: 0.015, 2: 0.020, 3: 0.025}, [2, 3, 4, 5]) == pytest.approx(0.020 + 0.025 + 0.030 + 0.035)
    assert seconds_left({1: 0.015, 2: 0.014, 3: 0.013}, [8]) == pytest.approx(0.013)  # never below the widest timed
