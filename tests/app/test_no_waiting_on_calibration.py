"""Nothing a user waits for waits on calibration: the window has its model before the verify sizes are timed
(and says what it is doing meanwhile), and sizes timed once are not timed again (for a day), so stopping the
server gives the chat its engine back at once and a model loaded again is usable at once. (Start → first answer
→ Stop is timed in test_server_panel.py.)"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

import engine.decoding.calibration as calibration
from engine.decoding import step_timings
from engine.decoding.calibration import calibration_sizes

from support.window import handled_on_gui, start

pytestmark = pytest.mark.slow  # step timings and a server in the window


def watch_timing(monkeypatch) -> list[list[int]]:
    """The sizes every calibration from now on really times, one list per calibration."""
    timed: list[list[int]] = []
    real = calibration.time_sizes

    def watched(target, slot, start_at, token, sizes, *args):
        timed.append(list(sizes))
        return real(target, slot, start_at, token, sizes, *args)

    monkeypatch.setattr(calibration, "time_sizes", watched)
    return timed


@pytest.fixture
def first_start(monkeypatch, tmp_path):
    """As at the app's first start on this machine: nothing timed yet (the run's own timings are set aside, not
    lost)."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(step_timings, "_tables", {})
    monkeypatch.setattr(step_timings, "_measured_at", {})


def test_the_model_is_usable_before_its_steps_are_timed_and_the_window_says_so(
    make_window, qtbot, quick_settings, first_start
):
    # Drafts of up to 8, so that only 9 sizes are timed.
    seen = {}
    window = make_window(replace(quick_settings, max_draft=8), wait_loaded=False)
    window.modelLoaded.connect(
        lambda info: seen.setdefault(
            "calibrated_when_loaded", window.engine.worker.decoder.loop.planner.steps.calibrated
        )
    )
    qtbot.waitUntil(lambda: "calibrated_when_loaded" in seen, timeout=120_000)
    assert seen["calibrated_when_loaded"] is False
    qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith("Timing steps"), timeout=10_000)
    assert window.progress.isVisible() and window.input.isEnabled()
    qtbot.waitUntil(lambda: window.statusBar().currentMessage() == "", timeout=120_000)
    assert window.engine.worker.decoder.loop.planner.steps.calibrated and not window.progress.isVisible()


def test_closing_the_window_stops_a_step_timing_at_once(make_window, qtbot, gemma_settings, first_start, monkeypatch):
    """Closing while the steps are timed ends the timing mid-way (Gemma's first took ~20 s here, and the window
    waited for it); of what it timed, only sizes timed in all their rounds are kept. The test holds one timing
    until the window has closed: close() returns while a timing is under way, and none that begins after it
    runs to its end."""
    timed: list[int] = []
    ended_after_close: list[int] = []  # timings begun after the window closed that ran to their end
    real = calibration.time_decode
    hold, held, closed = threading.Event(), threading.Event(), threading.Event()
    hold.set()  # timings run freely until the test holds one

    def watched(model, slot, start_at, token, rows, clock):
        after_close = closed.is_set()
        if not hold.is_set():
            held.set()
            hold.wait(120)
        seconds = real(model, slot, start_at, token, rows, clock)
        timed.append(rows)  # only timings that ran to their end
        if after_close:
            ended_after_close.append(rows)
        return seconds

    monkeypatch.setattr(calibration, "time_decode", watched)
    window = make_window(gemma_settings, wait_loaded=False)
    qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith("Timing steps"), timeout=120_000)
    qtbot.wait(300)  # into the wide batches
    hold.clear()
    qtbot.waitUntil(held.is_set, timeout=60_000)  # the worker is inside a timing, held there
    window.close()
    closed.set()
    assert not hold.is_set() and not window.engine.thread.isFinished()  # closing did not wait for the timing
    hold.set()
    qtbot.waitUntil(window.engine.thread.isFinished, timeout=60_000)  # closing asks; the timing stops at once
    # Stopped mid-decode: no multi-row decode begun after closing ran to its end (a one-row decode is not
    # interruptible, and takes a few milliseconds).
    assert [rows for rows in ended_after_close if rows > 1] == []
    kept = [rows for table in step_timings._tables.values() for _, rows in table]
    assert len(kept) < len(calibration_sizes(gemma_settings.max_draft + 1))  # cut short
    assert all(timed.count(rows) >= calibration.rounds_of(rows) for rows in kept)


def test_stopping_the_server_times_nothing_again(make_window, qtbot, monkeypatch):
    window = make_window()
    qtbot.waitUntil(lambda: window.engine.worker.decoder.loop.planner.steps.calibrated, timeout=120_000)
    timed = watch_timing(monkeypatch)
    panel = start(window, qtbot)
    assert timed == []  # the server serves on the chat's measured costs at once
    assert window.engine.worker.service.scheduler.loop.planner.steps.calibrated
    # What the button says the moment the panel has handled the click (connected after the panel's own slot):
    # a stop can end before the test reads the button afterwards.
    seen = []
    panel.start_button.clicked.connect(lambda: seen.append((panel.start_button.text(), panel.start_button.isEnabled())))
    with handled_on_gui(qtbot, window.engine.worker.serverStopped, 30_000):
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert seen == [("Stopping…", False)]
    qtbot.waitUntil(lambda: panel.start_button.text() == "Start server", timeout=10_000)
    qtbot.waitUntil(lambda: window.statusBar().currentMessage() == "", timeout=30_000)
    assert timed == []  # the chat got its engine back without timing a step


def test_a_model_loaded_again_is_usable_at_once(make_window, qtbot, monkeypatch):
    """A second window (or a reload) of the same file with the same settings takes the timings this process
    measured: nothing is timed again, and its planner starts calibrated."""
    first = make_window()
    qtbot.waitUntil(lambda: first.engine.worker.decoder.loop.planner.steps.calibrated, timeout=120_000)
    first.close()
    timed = watch_timing(monkeypatch)
    again = make_window()
    assert timed == []
    assert again.engine.worker.decoder.loop.planner.steps.calibrated
