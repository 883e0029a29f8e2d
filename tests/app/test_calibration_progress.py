"""Timing the steps for speculation (calibration) says how far it is, and never keeps a message waiting: a message
sent meanwhile is answered at once, on the sizes timed so far, and the timing goes on after the answer, timing
only what it had not (issue 52; the engine's side: tests/engine/test_calibration_resume.py)."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

import engine.decoding.calibration as calibration
from app.worker import TIMING
from engine.decoding import step_timings
from engine.decoding.calibration import calibration_sizes
from engine.methods import MAX_DRAFT_LIMIT

pytestmark = pytest.mark.slow  # step timings run to the end in the window

PROGRESS = re.compile(r"^Timing steps: (\d+) of (\d+)\b")


@pytest.fixture
def first_start(monkeypatch, tmp_path):
    """As at the app's first start on this machine: nothing timed yet (the run's own timings are set aside)."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(step_timings, "_tables", {})
    monkeypatch.setattr(step_timings, "_measured_at", {})


@pytest.fixture
def long_timing(quick_settings, first_start):
    """Drafts of up to the most a step verifies: the most sizes to time (24, 48 timings), so there is time to
    send a message while they are timed."""
    return replace(quick_settings, max_draft=MAX_DRAFT_LIMIT)


def watch_timings(monkeypatch) -> list[tuple[object, int]]:
    """(model, rows) of every timing that ran to its end (warm-ups included), in order."""
    timed: list[tuple[object, int]] = []
    real = calibration.time_decode

    def watched(model, slot, start, token, rows, clock):
        seconds = real(model, slot, start, token, rows, clock)
        timed.append((model, rows))
        return seconds

    monkeypatch.setattr(calibration, "time_decode", watched)
    return timed


def periods(working: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(start, end) of each stretch the worker said it was timing steps."""
    spans, begun = [], None
    for when, text in working:
        if text == TIMING:
            begun = when
        elif text == "" and begun is not None:
            spans.append((begun, when))
            begun = None
    return spans


def test_a_message_sent_while_steps_are_timed_is_answered_at_once_and_the_timing_goes_on_after(
    make_window, qtbot, long_timing, monkeypatch, wait_response
):
    timed = watch_timings(monkeypatch)
    window = make_window(long_timing, wait_loaded=False)
    worker = window.engine.worker
    # On the worker's thread, in the order it says so (a count, not a clock): these lambdas only append.
    order = itertools.count()
    working, first_token = [], []  # (order, text); (order, timings done by then)
    worker.working.connect(lambda text: working.append((next(order), text)))
    worker.progress.connect(lambda *_: first_token or first_token.append((next(order), len(timed))))
    qtbot.waitUntil(lambda: len(timed) >= 3 + 6, timeout=120_000)  # warm-ups, then a few sizes timed
    window.input.setPlainText("Say hello.")
    qtbot.mouseClick(window.send_button, Qt.MouseButton.LeftButton)
    reply = wait_response(window)
    assert reply.status == "done" and reply.content.strip()
    qtbot.waitUntil(lambda: len(periods(working)) >= 2 and working[-1][1] == "", timeout=300_000)

    spans = periods(working)
    assert len(spans) == 2  # cut short once, resumed once
    answered_at, timed_by_then = first_token[0]
    assert answered_at < spans[1][0]  # the answer did not wait for the rest of the timing ...
    assert timed_by_then < len(timed)  # ... nor for all of it: timings were left for after the answer
    target = worker.decoder.target
    assert worker.decoder.loop.planner.steps.calibrated
    sizes = calibration_sizes(MAX_DRAFT_LIMIT + 1)
    threads = target.settings.resolved_threads()  # the count it began at, whatever the answer's steps tried since
    assert sorted(rows for t, rows in target.step_timings if t == threads) == sizes
    # Nothing timed before the cut was timed again: each size twice in all (1 row and the widest also warm up).
    counts = {rows: sum(1 for model, r in timed if model is target and r == rows) for rows in sizes}
    assert {rows: n for rows, n in counts.items() if rows not in (1, sizes[-1])} == {rows: 2 for rows in sizes[1:-1]}


def test_the_status_bar_counts_the_timings_up_with_an_estimate_of_the_time_left(make_window, qtbot, long_timing):
    window = make_window(long_timing, wait_loaded=False)
    shown: list[str] = []
    window.statusBar().messageChanged.connect(shown.append)
    qtbot.waitUntil(lambda: any(PROGRESS.match(text) for text in shown), timeout=300_000)
    qtbot.waitUntil(lambda: shown[-1] == "", timeout=300_000)
    progress = [PROGRESS.match(text) for text in shown if PROGRESS.match(text)]
    done = [int(m.group(1)) for m in progress]
    assert {int(m.group(2)) for m in progress} == {48}  # 24 sizes: 1-17 and every 8th to 64, 65; twice each
    assert done == sorted(done) and len(set(done)) >= 3 and done[-1] == 48  # counts up, to the end
    estimates = [text for text in shown if text.endswith(" left (estimate)")]
    assert estimates and all(len(text) <= 50 for text in shown)  # labelled; short enough not to be cut off
