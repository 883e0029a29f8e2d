"""Help → System check…, as a person uses it: the window reads this machine in a child process at once, and
Measure speed times the window's own model there (the real engine.doctor, the real embedded SmolLM2): its steps
counted as they happen with an estimate of the time left, RAM as the OS has it available, the window's own
method named when it runs slower than plain decoding, and a CPU busy with other work named as such."""

import re
import subprocess
import sys
from dataclasses import replace

import psutil
import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication

from engine.lab.doctor import BUSY_CPU_PERCENT
from engine.modelfiles.embedded import resolve_model

from support.window import menu_actions

pytestmark = pytest.mark.slow  # the system check measures the real model for minutes

GIB = 2**30


def open_check(window, qtbot):
    dict(menu_actions(window))["Help → System check…"].trigger()
    dialog = window.tools.system_check
    qtbot.waitUntil(lambda: dialog.isVisible() and not dialog.running, timeout=120_000)
    return dialog


def measure(dialog, qtbot, rounds: int = 1) -> list[tuple[str, int, int, bool]]:
    """Click Measure speed and wait for the report; what the status line and the bar showed meanwhile, sampled
    as a person would see them: (status, bar value, bar maximum, bar visible)."""
    dialog.bench_rounds = rounds  # the path, not the length
    seen = []
    timer = QTimer(dialog)
    timer.timeout.connect(
        lambda: seen.append((dialog.status.text(), dialog.busy.value(), dialog.busy.maximum(), dialog.busy.isVisible()))
    )
    timer.start(20)
    qtbot.mouseClick(dialog.bench_button, Qt.MouseButton.LeftButton)
    assert dialog.running and not dialog.bench_button.isEnabled() and dialog.busy.isVisible()
    qtbot.waitUntil(lambda: not dialog.running, timeout=900_000)  # a loaded 2-core machine: minutes
    timer.stop()
    return seen


def problems_text(dialog) -> str:
    return dialog.problems.text() if dialog.problems.isVisible() else ""


def test_the_system_check_reads_the_machine_then_measures_the_windows_model(make_window, qtbot):
    window = make_window()
    dialog = open_check(window, qtbot)
    assert "bench" not in dialog.report and "model" not in dialog.report  # opening loads nothing
    text = dialog.text.toPlainText()
    assert "backend CPU" in text and "VRAM reader: n/a" in text and "No problems found." in text
    assert not dialog.problems.isVisible() and dialog.bench_button.isEnabled()
    # no time promised that nothing measured: neither on the button nor in its tooltip
    assert not re.search(r"\d+\s*s\b", dialog.bench_button.text() + dialog.bench_button.toolTip())

    measure(dialog, qtbot)
    report = dialog.report
    assert report["model"]["path"] == str(resolve_model(window.settings.model))  # the window's, loaded again there
    assert report["bench"]["methods"]["plain"]["tokens_per_s"] > 0
    assert "lookup" in dialog.text.toPlainText() and "tok/s" in dialog.text.toPlainText()
    assert dialog.status.text().startswith("Measured just now") and "the check took" in dialog.status.text()
    dialog.copy_report()
    assert "layers on the GPU 0/31" in QGuiApplication.clipboard().text()


def test_measuring_says_what_it_measures_and_n_of_m_with_an_estimate_from_the_runs_so_far(make_window, qtbot):
    window = make_window()
    dialog = open_check(window, qtbot)
    seen = measure(dialog, qtbot)
    statuses = [s for s, *_ in seen]
    # one round without a draft: load the model, calibrate, plain, lookup; the runs (seconds each) seen live
    for step, doing in [(3, "plain decoding, run 1 of 1"), (4, "prompt lookup, run 1 of 1")]:
        assert any(doing in s and f"step {step} of 4" in s for s in statuses), (step, statuses)
    # and every step, however short, in the report with the time it took
    took = re.search(r"The check took ([\d.]+) s \(measured\): (.*)", dialog.text.toPlainText())
    steps = re.findall(r"(\d) of 4 ([^;]+?) ([\d.]+) s", took.group(2))
    assert [(n, doing) for n, doing, _ in steps] == [
        ("1", "loading the model"),
        ("2", "timing each step size once (calibration)"),
        ("3", "plain decoding, run 1 of 1"),
        ("4", "prompt lookup, run 1 of 1"),
    ]
    assert sum(float(t) for *_, t in steps) <= float(took.group(1)) + 0.5
    # no fixed time promised: every "s left" is the estimate, labelled so
    assert all("(an estimate from the runs timed so far)" in s for s in statuses if " s left" in s)
    # before any run is timed there is nothing to estimate from; after the plain run, an estimate, labelled so
    assert all("estimated once the first run is timed" in s for s in statuses if "step 3 of 4" in s)
    last = [s for s in statuses if "step 4 of 4" in s][0]
    estimate = float(re.search(r"about (\d+) s left \(an estimate from the runs timed so far\)", last).group(1))
    plain_run = dialog.report["bench"]["seconds"]  # both runs; the estimate is the plain run's time alone
    assert 0 <= estimate <= plain_run + 1
    assert any(value == 3 and maximum == 4 and shown for _, value, maximum, shown in seen)  # the bar: 3 of 4 done
    assert not dialog.busy.isVisible()
    took = int(re.search(r"the check took (\d+) s", dialog.status.text()).group(1))
    assert took >= dialog.report["bench"]["seconds"] - 1  # measured by the window around the child's own runs


def test_free_ram_is_what_the_os_has_available_and_specchats_own_memory_is_shown_apart(make_window, qtbot):
    """llama.cpp's CPU device reports its total as free (ggml-cpu.cpp: "assume that all of it is free"): the
    check showed "free 23.54 GiB of 23.54 GiB" while SpecChat held 3 GB."""
    window = make_window()
    dialog = open_check(window, qtbot)
    text = dialog.text.toPlainText()
    ram = psutil.virtual_memory()
    free, total = map(float, re.search(r"CPU \(.*\): CPU, free ([\d.]+) GiB of ([\d.]+) GiB", text).groups())
    assert total == round(ram.total / GIB, 2)
    assert free < total  # never the total: some memory is always in use, this window's for one
    assert abs(free - ram.available / GIB) < 1.0  # the OS's available figure, read a moment apart
    own = float(
        re.search(r"SpecChat's own resident memory \(the SpecChat window, pid (\d+)\): ([\d.]+) GiB", text).group(2)
    )
    assert re.search(rf"the SpecChat window, pid {psutil.Process().pid}\)", text)  # this window, not the child
    assert abs(own - psutil.Process().memory_info().rss / GIB) < 0.25  # the model loaded here is in it
    assert "No problems found." in text


def test_the_windows_method_slower_than_plain_here_is_named_with_a_choice(make_window, qtbot, quick_settings):
    """Prompt lookup with the planner off, always verifying 64 rows: on this CPU each step costs many one-row
    steps while the drafts are mostly refused (measured 0.21x plain here), so it is slower than plain decoding."""
    window = make_window(replace(quick_settings, method="lookup", speculation=True, adaptive=False, max_draft=64))
    dialog = open_check(window, qtbot)
    measure(dialog, qtbot, rounds=3)  # fastest of 3: one run slowed by other work does not decide
    lookup = dialog.report["bench"]["methods"]["lookup"]
    assert dialog.report["bench"]["method"] == "lookup"  # the window's method, as its settings say
    shown = problems_text(dialog)
    named = f"lookup ran at {lookup['vs_plain']:g}× plain decoding on this machine" in shown
    assert named == (lookup["vs_plain"] < 1.0), (lookup, shown)  # named exactly when measured slower
    # The premise holds on this CPU (0.21x measured here) unless other work spoilt the runs, which the check
    # then says itself.
    assert lookup["vs_plain"] < 1.0 or "the figures above are not reliable" in shown, (lookup, shown)
    if named:
        assert "Settings → Speculation:" in shown and "No problems found." not in dialog.text.toPlainText()
        assert (
            "<- the window's method"
            in [line for line in dialog.text.toPlainText().splitlines() if line.strip().startswith("lookup")][0]
        )


def test_a_cpu_busy_with_other_processes_makes_the_figures_unreliable_and_says_so(make_window, qtbot):
    window = make_window()
    dialog = open_check(window, qtbot)
    cores = psutil.cpu_count() or 1
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        measure(dialog, qtbot)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    cpu = dialog.report["bench"]["cpu"]
    assert cpu["others_percent"] > BUSY_CPU_PERCENT  # the hogs took their share of every core
    shown = problems_text(dialog)
    assert f"Other processes used {cpu['others_percent']:g}% of the CPU ({cores} cores)" in shown
    assert "not reliable" in shown and f"above {BUSY_CPU_PERCENT:g}%" in shown


def test_closing_the_check_mid_bench_stops_its_child(make_window, qtbot):
    window = make_window()
    dialog = open_check(window, qtbot)
    qtbot.mouseClick(dialog.bench_button, Qt.MouseButton.LeftButton)
    process = dialog.process
    qtbot.waitUntil(lambda: process.processId() > 0, timeout=30_000)
    dialog.close()
    assert not dialog.running and process.state() == process.ProcessState.NotRunning
    assert dialog.bench_button.isEnabled() and not dialog.busy.isVisible()
    assert dialog.status.text() == "Stopped when this window was closed."  # not "Measuring…" when opened again
