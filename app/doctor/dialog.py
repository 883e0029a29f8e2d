"""The System check window: what this machine and this llama.cpp build give SpecChat, and a measured bench.

It runs `python -m engine.doctor --json --progress` (`specchat doctor` in a bundle) as a child process, so loading
the model again for the bench can neither crash nor freeze the window: on opening, the system alone; on "Measure
speed", the current model (and draft) loaded a second time and plain decoding timed against speculation, a fixed
number of runs each. How long that takes depends on the machine and the model, so nothing promises a time: each
step the child announces is shown as "n of m" with the time left it estimates from the runs already timed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

from PySide6.QtCore import QProcess, Qt, QTimer
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine.lab.doctor import DEFAULT_ROUNDS, describe
from engine.methods import DEFAULT_METHOD

PROBLEM_STYLE = "background: rgba(255, 160, 0, 50); border-radius: 4px; padding: 8px;"


def doctor_command(*args: str) -> tuple[str, list[str]]:
    """(program, arguments) that run the doctor in a child, from a source install or a bundle."""
    if getattr(sys, "frozen", False):
        return sys.executable, ["doctor", *args]
    return sys.executable, ["-m", "engine.doctor", *args]


class SystemCheckDialog(QDialog):
    def __init__(
        self,
        current_models: Callable[[], list[str]],
        parent: QWidget | None = None,
        current_method: Callable[[], str] | None = None,
    ):
        """current_models() -> the doctor's arguments for the window's model: --model, --draft, --gpu-layers, ...;
        current_method() -> the method the chat uses (by default the parent window's settings, else the app's
        default), which the bench reports when it is slower than plain decoding here."""
        super().__init__(parent)
        self.setWindowTitle("System check")
        self.resize(760, 560)
        self._current_models = current_models
        self._current_method = current_method or self._window_method
        self.report: dict | None = None
        self.bench_rounds = DEFAULT_ROUNDS
        self.process: QProcess | None = None
        self.progress: dict | None = None  # the child's last announced step
        self._out = b""  # a partial line
        self._lines: list[bytes] = []  # the lines that are not progress
        self._started = self._progress_at = 0.0
        self._tick = QTimer(self, interval=1000)  # the seconds so far and the estimate left move during a long run
        self._tick.timeout.connect(self._show_status)
        self._build()
        self.run("--no-model")

    def _build(self) -> None:
        """The status and steps above the report, what went wrong in red, the report, and the buttons."""
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # a failure quotes the child's output
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)
        self.busy.setFormat("%v of %m steps")
        self.problems = QLabel()
        self.problems.setWordWrap(True)
        self.problems.setTextFormat(Qt.TextFormat.PlainText)  # device and model names are read, not ours
        self.problems.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.problems.setStyleSheet(PROBLEM_STYLE)
        self.text = QPlainTextEdit(readOnly=True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        layout = QVBoxLayout(self)
        layout.addWidget(self.status)
        layout.addWidget(self.busy)
        layout.addWidget(self.problems)
        layout.addWidget(self.text, 1)
        layout.addLayout(self._buttons())
        self.problems.hide()

    def _buttons(self) -> QHBoxLayout:
        self.bench_button = QPushButton("Measure speed")
        self.bench_button.setToolTip(
            "Loads the current model a second time and times plain decoding against "
            "prompt lookup (and the draft model and auto, if a draft is set) on a code edit, "
            f"{DEFAULT_ROUNDS} runs of each. The time it takes depends on this machine and "
            "the model: the steps and an estimate of the time left show as it goes."
        )
        self.bench_button.clicked.connect(self.measure)
        self.copy_button = QPushButton("Copy report")
        self.copy_button.clicked.connect(self.copy_report)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addWidget(self.bench_button)
        buttons.addWidget(self.copy_button)
        buttons.addStretch(1)
        buttons.addWidget(close)
        return buttons

    @property
    def running(self) -> bool:
        return self.process is not None

    def _window_method(self) -> str:
        settings = getattr(self.parent(), "settings", None)
        return getattr(settings, "effective_method", DEFAULT_METHOD)

    def _window_speculation(self) -> list[str]:
        """The chat's draft lengths, planner and cutoff, so the bench runs each method as the chat does."""
        s = getattr(self.parent(), "settings", None)
        if s is None:
            return []
        return [
            "--max-draft",
            str(s.max_draft),
            "--min-draft",
            str(min(s.min_draft, max(s.max_draft, 1))),
            "--p-min",
            f"{s.p_min:g}",
            *([] if s.adaptive else ["--fixed-draft"]),
        ]

    def measure(self) -> None:
        self.run(
            *self._current_models(),
            "--method",
            self._current_method(),
            *self._window_speculation(),
            "--rounds",
            str(self.bench_rounds),
        )

    def run(self, *args: str) -> None:
        if self.running:
            return
        program, arguments = doctor_command("--json", "--progress", "--app-pid", str(os.getpid()), *args)
        self.process = process = QProcess(self)
        process.readyReadStandardOutput.connect(lambda: self._read(process))
        process.finished.connect(lambda code, _status: self._finished(process, code))
        process.errorOccurred.connect(lambda error: self._failed_to_start(process, error))
        measuring = "--no-model" not in args
        self.progress, self._out, self._lines, self._started = None, b"", [], time.monotonic()
        self.status.setText(
            "Measuring: starting the check…" if measuring else "Reading this machine and its llama.cpp build…"
        )
        self.busy.setRange(0, 0)  # no step count until the child announces one
        self.busy.setTextVisible(False)
        self.busy.show()
        self.bench_button.setEnabled(False)
        process.start(program, arguments)

    def _read(self, process: QProcess) -> None:
        """The child's progress lines, as they come; the report (its last line) waits for the end."""
        if process is not self.process:
            return
        self._out += bytes(process.readAllStandardOutput().data())
        *lines, self._out = self._out.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                message = None
            if isinstance(message, dict) and "progress" in message:
                self._show_progress(message["progress"])
            elif line.strip():
                self._lines.append(line)  # the report: kept for _finished

    def _show_progress(self, p: dict) -> None:
        self.progress, self._progress_at = p, time.monotonic()
        self.busy.setRange(0, p["steps"])
        self.busy.setValue(p["step"] - 1)  # steps done before this one
        self.busy.setTextVisible(True)
        self._show_status()
        self._tick.start()

    def _show_status(self) -> None:
        """The step being measured, n of m, the seconds so far, and the child's estimate of the time left less
        what has passed since it was made."""
        p = self.progress
        if p is None or not self.running:
            return
        now = time.monotonic()
        if p["left_s"] is None:
            left = "time left: estimated once the first run is timed"
        elif p["left_s"] - (now - self._progress_at) >= 0:
            left = (
                f"about {p['left_s'] - (now - self._progress_at):.0f} s left (an estimate from the runs timed so far)"
            )
        else:
            left = "taking longer than the estimate from the runs timed so far"
        self.status.setText(
            f"Measuring {p['doing']}: step {p['step']} of {p['steps']}, "
            f"{p['step'] - 1} done; {now - self._started:.0f} s so far, {left}."
        )

    def _failed_to_start(self, process: QProcess, error) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self._done(f"The check could not start: {process.errorString()}")

    def _finished(self, process: QProcess, code: int) -> None:
        if process is not self.process:
            return
        self._read(process)
        out = [line.decode(errors="replace") for line in [*self._lines, self._out] if line.strip()]
        err = bytes(process.readAllStandardError().data()).decode(errors="replace").strip()
        try:
            report = json.loads(out[-1]) if out else None
        except json.JSONDecodeError:
            report = None
        if report is None or "error" in report:
            reason = report["error"] if report else (err[-1500:] or f"it ended with code {code}")
            self._done(f"The check failed: {reason}")
            return
        self.report = report
        self.text.setPlainText(describe(report))
        found = report.get("problems") or []
        self.problems.setText("\n\n".join(f"{p['problem']}\nFix: {p['fix']}" for p in found))
        self.problems.setVisible(bool(found))
        took = time.monotonic() - self._started
        self._done(
            f"Measured just now on this machine; the check took {took:.0f} s."
            if "bench" in report
            else "This machine, read just now. Measure speed to time the current model."
        )

    def _done(self, status: str) -> None:
        self.process = None
        self._tick.stop()
        self.status.setText(status)
        self.busy.hide()
        self.bench_button.setEnabled(True)

    def copy_report(self) -> None:
        QGuiApplication.clipboard().setText(self.text.toPlainText())

    def closeEvent(self, event) -> None:
        if self.process is not None:  # a bench would go on loading the cores for nothing
            process = self.process
            self._done("Stopped when this window was closed.")  # first: its finished signal is then ignored
            process.kill()
            process.waitForFinished(3000)
        super().closeEvent(event)
