"""The System check window: what this machine and this llama.cpp build give SpecChat, and a measured bench.

It runs `python -m engine.doctor --json` (`specchat doctor` in a bundle) as a child process, so loading the model
again for the bench can neither crash nor freeze the window: on opening, the system alone (a few seconds); on
"Measure speed", the current model (and draft) loaded a second time and plain decoding timed against
speculation for about 15 s.
"""
from __future__ import annotations

import json
import sys
from typing import Callable

from PySide6.QtCore import QProcess, Qt
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (QDialog, QHBoxLayout, QLabel, QPlainTextEdit, QProgressBar, QPushButton,
                               QVBoxLayout, QWidget)

from engine.lab.doctor import DEFAULT_SECONDS, describe

PROBLEM_STYLE = "background: rgba(255, 160, 0, 50); border-radius: 4px; padding: 8px;"


def doctor_command(*args: str) -> tuple[str, list[str]]:
    """(program, arguments) that run the doctor in a child, from a source install or a bundle."""
    if getattr(sys, "frozen", False):
        return sys.executable, ["doctor", *args]
    return sys.executable, ["-m", "engine.doctor", *args]


class SystemCheckDialog(QDialog):
    def __init__(self, current_models: Callable[[], list[str]], parent: QWidget | None = None):
        """current_models() -> the doctor's arguments for the window's model: --model, --draft, --gpu-layers, ..."""
        super().__init__(parent)
        self.setWindowTitle("System check")
        self.resize(760, 560)
        self._current_models = current_models
        self.report: dict | None = None
        self.bench_seconds = DEFAULT_SECONDS
        self.process: QProcess | None = None

        self.status = QLabel()
        self.status.setWordWrap(True)
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)
        self.busy.setTextVisible(False)
        self.problems = QLabel()
        self.problems.setWordWrap(True)
        self.problems.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.problems.setStyleSheet(PROBLEM_STYLE)
        self.text = QPlainTextEdit(readOnly=True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.bench_button = QPushButton("Measure speed (~20 s)")
        self.bench_button.setToolTip("Loads the current model a second time and times plain decoding against "
                                     "prompt lookup (and the draft model and auto, if a draft is set) on a code edit.")
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
        layout = QVBoxLayout(self)
        layout.addWidget(self.status)
        layout.addWidget(self.busy)
        layout.addWidget(self.problems)
        layout.addWidget(self.text, 1)
        layout.addLayout(buttons)
        self.problems.hide()
        self.run("--no-model")

    @property
    def running(self) -> bool:
        return self.process is not None

    def measure(self) -> None:
        self.run(*self._current_models(), "--seconds", f"{self.bench_seconds:g}")

    def run(self, *args: str) -> None:
        if self.running:
            return
        program, arguments = doctor_command("--json", *args)
        self.process = process = QProcess(self)
        process.finished.connect(lambda code, _status: self._finished(process, code))
        process.errorOccurred.connect(lambda error: self._failed_to_start(process, error))
        measuring = "--no-model" not in args
        self.status.setText("Measuring: the model is loaded a second time, then plain decoding and speculation "
                            "take turns for about 15 s…" if measuring else "Reading this machine and its "
                            "llama.cpp build…")
        self.busy.show()
        self.bench_button.setEnabled(False)
        process.start(program, arguments)

    def _failed_to_start(self, process: QProcess, error) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self._done(f"The check could not start: {process.errorString()}")

    def _finished(self, process: QProcess, code: int) -> None:
        if process is not self.process:
            return
        out = bytes(process.readAllStandardOutput()).decode(errors="replace").strip().splitlines()
        err = bytes(process.readAllStandardError()).decode(errors="replace").strip()
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
        self._done("Measured just now on this machine." if "bench" in report else
                   "This machine, read just now. Measure speed to time the current model.")

    def _done(self, status: str) -> None:
        self.process = None
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
