"""Help → System check…, as a person uses it: the window reads this machine in a child process at once, and
Measure speed times the window's own model there (the real engine.doctor, the real embedded SmolLM2)."""
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from engine.modelfiles.embedded import resolve_model

from test_every_menu import menu_actions  # tests/app/test_every_menu.py


def open_check(window, qtbot):
    dict(menu_actions(window))["Help → System check…"].trigger()
    dialog = window._system_check
    qtbot.waitUntil(lambda: dialog.isVisible() and not dialog.running, timeout=120_000)
    return dialog


def test_the_system_check_reads_the_machine_then_measures_the_windows_model(make_window, qtbot):
    window = make_window()
    dialog = open_check(window, qtbot)
    assert "bench" not in dialog.report and "model" not in dialog.report  # opening loads nothing
    text = dialog.text.toPlainText()
    assert "backend CPU" in text and "VRAM reader: n/a" in text and "No problems found." in text
    assert not dialog.problems.isVisible() and dialog.bench_button.isEnabled()

    dialog.bench_seconds = 0  # one round of each method: the path, not the length
    qtbot.mouseClick(dialog.bench_button, Qt.MouseButton.LeftButton)
    assert dialog.running and not dialog.bench_button.isEnabled() and dialog.busy.isVisible()
    qtbot.waitUntil(lambda: not dialog.running, timeout=300_000)
    report = dialog.report
    assert report["model"]["path"] == str(resolve_model(window.settings.model))  # the window's, loaded again there
    assert report["bench"]["methods"]["plain"]["tokens_per_s"] > 0
    assert "lookup" in dialog.text.toPlainText() and "tok/s" in dialog.text.toPlainText()
    assert dialog.status.text().startswith("Measured just now")
    dialog.copy_report()
    assert "layers on the GPU 0/31" in QGuiApplication.clipboard().text()


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
