"""The speculation lab window: run plain vs speculative decoding at rising concurrency on this
machine, watch the chart fill in, read the advice, and apply it to the chat.

The run happens on a QThread (LabWorker) through engine.lab.run_lab, the same code as the CLI;
the GUI only sends a config and receives signals. Cancel is a threading.Event the engine checks
every step.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QLogValueAxis, QValueAxis
from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QGridLayout, QGroupBox,
                               QHBoxLayout, QLabel, QLineEdit, QMessageBox, QProgressBar, QPushButton, QSpinBox,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from engine.errors import EngineError, GenerationCancelled
from engine.lab import LabConfig, LabProgress, run_lab
from engine.lab_report import METHOD_COLOURS, METHOD_WORDS, crossover, with_analysis
from engine.paths import resources_dir

log = logging.getLogger(__name__)

PROMPT_SETS = {"grounded": "Grounded and editing tasks", "open": "Open-ended chat"}
CUSTOM = "custom"
LEVELS = (1, 2, 4, 8, 16)
PROGRESS_EVERY_S = 0.1  # at most ten progress signals a second
NA = "n/a"


class LabWorker(QObject):
    """Runs one lab at a time on its own thread. Signals carry plain data only."""

    progress = Signal(object)  # LabProgress
    cellDone = Signal(object)  # a cell dict
    finished = Signal(object)  # the results document, analysed
    failed = Signal(str)
    cancelled = Signal()

    @Slot(object, object)
    def run(self, config: LabConfig, cancel: threading.Event) -> None:
        last = 0.0

        def on_progress(p: LabProgress) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S or p.generated >= p.expected:
                last = now
                self.progress.emit(p)

        try:
            results = run_lab(config, on_progress, self.cellDone.emit, cancel)
        except GenerationCancelled:
            self.cancelled.emit()
        except (EngineError, OSError, ValueError) as exc:
            self.failed.emit(str(exc))
        except Exception as exc:  # noqa: BLE001 — a bug must reach the user, not kill the thread
            log.exception("lab run")
            self.failed.emit(f"The lab stopped with an unexpected error: {exc}")
        else:
            self.finished.emit(with_analysis(results))


class LabChart(QChartView):
    """One measure vs concurrency (log2 axis), a line per method, points added as cells finish."""

    def __init__(self, title: str, unit: str, key: str, parent=None):
        super().__init__(parent)
        self.key = key
        self.chart_ = QChart()
        self.chart_.setTitle(title)
        self.chart_.legend().setAlignment(Qt.AlignBottom)
        self.x_axis = QLogValueAxis()
        self.x_axis.setBase(2)
        self.x_axis.setLabelFormat("%d")
        self.x_axis.setTitleText("concurrent sequences")
        self.y_axis = QValueAxis()
        self.y_axis.setTitleText(unit)
        self.chart_.addAxis(self.x_axis, Qt.AlignBottom)
        self.chart_.addAxis(self.y_axis, Qt.AlignLeft)
        self.setChart(self.chart_)
        self.setRenderHint(QPainter.Antialiasing)
        self.setMinimumSize(360, 260)
        self.series: dict[str, QLineSeries] = {}
        self._marker: QLineSeries | None = None
        self.clear()

    def clear(self) -> None:
        self.chart_.removeAllSeries()
        self.series.clear()
        self._marker = None
        self.x_axis.setRange(1, 8)
        self.y_axis.setRange(0, 1)

    def add(self, cell: dict) -> None:
        value = cell.get(self.key)
        if value is None:
            return
        method = cell["method"]
        series = self.series.get(method)
        if series is None:
            series = self.series[method] = QLineSeries()
            series.setName(METHOD_WORDS.get(method, method))
            series.setPointsVisible(True)
            series.setColor(QColor(METHOD_COLOURS.get(method, "#000000")))
            self.chart_.addSeries(series)
            series.attachAxis(self.x_axis)
            series.attachAxis(self.y_axis)
        series.append(cell["concurrency"], value)
        self._rescale()

    def mark(self, at: float, label: str) -> None:
        """A dashed vertical line where speculation stops paying."""
        self._marker = QLineSeries()
        self._marker.setName(label)
        pen = QPen(QColor("#888888"))
        pen.setStyle(Qt.DashLine)
        self._marker.setPen(pen)
        top = self.y_axis.max()
        self._marker.append(at, 0)
        self._marker.append(at, top)
        self.chart_.addSeries(self._marker)
        self._marker.attachAxis(self.x_axis)
        self._marker.attachAxis(self.y_axis)

    def _rescale(self) -> None:
        points = [p for s in self.series.values() for p in s.points()]
        xs, ys = [p.x() for p in points], [p.y() for p in points]
        self.x_axis.setRange(min(xs + [1]), max(xs + [2]))
        self.y_axis.setRange(0, max(ys) * 1.15 if ys and max(ys) > 0 else 1)

    def points(self, method: str) -> list[tuple[float, float]]:
        series = self.series.get(method)
        return [(p.x(), p.y()) for p in series.points()] if series else []


def _fmt(value, fmt: str) -> str:
    return NA if value is None else format(value, fmt)


class LabWindow(QWidget):
    """Pick models, methods, levels and prompts; run; read and apply the advice."""

    applySettings = Signal(dict)  # e.g. {"method": "lookup", "max_draft": 8, "adaptive": True}
    runFinished = Signal(object)  # the results document
    runCancelled = Signal()
    runFailed = Signal(str)
    _start = Signal(object, object)  # to the worker: config, cancel event

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Speculation lab")
        self.setWindowFlag(Qt.Window)
        self.results: dict | None = None
        self.recommendation: dict | None = None
        self._cancel: threading.Event | None = None
        self._build()
        self._thread = QThread(self)
        self._worker = LabWorker()
        self._worker.moveToThread(self._thread)
        self._start.connect(self._worker.run)
        self._worker.progress.connect(self._on_progress)
        self._worker.cellDone.connect(self._on_cell)
        self._worker.finished.connect(self._on_finished)
        self._worker.failed.connect(self._on_failed)
        self._worker.cancelled.connect(self._on_cancelled)
        self._set_running(False)

    # --- layout -------------------------------------------------------------------------------
    def _build(self) -> None:
        form = QFormLayout()
        self.model_edit = QLineEdit("embedded")
        self.model_edit.setToolTip("A GGUF file, 'embedded' for the built-in SmolLM2 135M Instruct, or "
                                   "'embedded-gemma' for the built-in Gemma 3 270M base model.")
        form.addRow("Target model", self._with_browse(self.model_edit))
        self.draft_edit = QLineEdit()
        self.draft_edit.setPlaceholderText("none (needed for the draft-model method)")
        self.draft_edit.textChanged.connect(self._draft_changed)
        form.addRow("Draft model", self._with_browse(self.draft_edit))

        self.method_boxes = {}
        methods = QHBoxLayout()
        for method in ("none", "lookup", "draft"):
            box = QCheckBox(METHOD_WORDS[method])
            box.setChecked(method != "draft")
            self.method_boxes[method] = box
            methods.addWidget(box)
        self.method_boxes["none"].setEnabled(False)  # the baseline every speed-up is measured against
        self.method_boxes["none"].setToolTip("Plain decoding is always run: it is the baseline.")
        form.addRow("Methods", methods)

        self.level_boxes = {}
        levels = QHBoxLayout()
        for level in LEVELS:
            box = QCheckBox(str(level))
            box.setChecked(level <= 8)
            self.level_boxes[level] = box
            levels.addWidget(box)
        form.addRow("Concurrency", levels)

        self.prompt_combo = QComboBox()
        for key, label in PROMPT_SETS.items():
            self.prompt_combo.addItem(label, key)
        self.prompt_combo.addItem("Custom file…", CUSTOM)
        self.prompt_file = QLineEdit()
        self.prompt_file.setPlaceholderText("JSON lines of {\"id\", \"prompt\"}")
        self.prompt_file.setVisible(False)
        self.prompt_combo.currentIndexChanged.connect(
            lambda: self.prompt_file.setVisible(self.prompt_combo.currentData() == CUSTOM))
        prompts = QVBoxLayout()
        prompts.addWidget(self.prompt_combo)
        prompts.addWidget(self.prompt_file)
        form.addRow("Prompts", prompts)

        self.max_tokens = QSpinBox(minimum=4, maximum=2048, value=128)
        self.max_draft = QSpinBox(minimum=1, maximum=64, value=8)
        self.adaptive = QCheckBox("adaptive (as in the chat)")
        self.adaptive.setChecked(True)
        self.adaptive.setToolTip("On: measured acceptance and step times pick each step's draft lengths.\n"
                                 "Off: every sequence always drafts up to the maximum — speculation itself.")
        self.threads = QSpinBox(minimum=0, maximum=256, value=0)
        self.threads.setSpecialValueText("auto")
        self.repeats = QSpinBox(minimum=1, maximum=20, value=1)
        self.repeats.setToolTip("Runs per cell, methods alternating; the fastest is kept.\n"
                                "Raise it when other programs keep the machine busy.")
        form.addRow("Tokens per request", self.max_tokens)
        drafting = QHBoxLayout()
        drafting.addWidget(self.max_draft)
        drafting.addWidget(self.adaptive)
        form.addRow("Max draft tokens", drafting)
        form.addRow("Threads", self.threads)
        form.addRow("Repeats", self.repeats)
        setup = QGroupBox("Experiment")
        setup.setLayout(form)

        self.run_button = QPushButton("Run")
        self.run_button.clicked.connect(self.start_run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_run)
        self.save_button = QPushButton("Save results…")
        self.save_button.clicked.connect(self._save_dialog)
        self.load_button = QPushButton("Load results…")
        self.load_button.clicked.connect(self._load_dialog)
        buttons = QHBoxLayout()
        for b in (self.run_button, self.cancel_button, self.save_button, self.load_button):
            buttons.addWidget(b)

        self.progress = QProgressBar(minimum=0, maximum=100)
        self.status = QLabel("Choose what to compare, then Run.")
        self.status.setWordWrap(True)
        self.rate_chart = LabChart("Aggregate throughput", "tokens/s", "aggregate_tokens_per_s")
        self.itl_chart = LabChart("Inter-token latency (p50)", "ms per token", "itl_p50_ms")
        charts = QHBoxLayout()
        charts.addWidget(self.rate_chart)
        charts.addWidget(self.itl_chart)

        self.table = QTableWidget(0, 8)
        self.table.setHorizontalHeaderLabels(["method", "concurrency", "aggregate tok/s", "per-request tok/s",
                                              "ITL p50 / p95 ms", "end-to-end p50 / p95 s", "acceptance",
                                              "utilisation / memory"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)

        self.advice = QLabel("")
        self.advice.setWordWrap(True)
        self.advice.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.apply_button = QPushButton("Apply recommended settings")
        self.apply_button.setEnabled(False)
        self.apply_button.clicked.connect(self._apply)
        advice_box = QGroupBox("Advice")
        advice_layout = QVBoxLayout(advice_box)
        advice_layout.addWidget(self.advice)
        advice_layout.addWidget(self.apply_button, alignment=Qt.AlignRight)

        left = QVBoxLayout()
        left.addWidget(setup)
        left.addLayout(buttons)
        left.addWidget(self.progress)
        left.addWidget(self.status)
        left.addStretch(1)
        grid = QGridLayout(self)
        grid.addLayout(left, 0, 0, 2, 1)
        grid.addLayout(charts, 0, 1)
        grid.addWidget(self.table, 1, 1)
        grid.addWidget(advice_box, 2, 0, 1, 2)
        grid.setColumnStretch(1, 1)
        self.resize(1200, 760)

    def _with_browse(self, edit: QLineEdit) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addWidget(edit, 1)
        browse = QPushButton("Browse…")
        browse.clicked.connect(lambda: self._browse_gguf(edit))
        row.addWidget(browse)
        return row

    def _browse_gguf(self, edit: QLineEdit) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", "", "GGUF models (*.gguf)")
        if path:
            edit.setText(path)

    def _draft_changed(self, text: str) -> None:
        box = self.method_boxes["draft"]
        box.setEnabled(bool(text.strip()))
        if not text.strip():
            box.setChecked(False)

    # --- running ------------------------------------------------------------------------------
    def config(self) -> LabConfig:
        """The experiment as chosen; raises InvalidSettingError (an EngineError) when it cannot run."""
        key = self.prompt_combo.currentData()
        prompts = self.prompt_file.text().strip() if key == CUSTOM else str(resources_dir() / "prompts" / f"{key}.jsonl")
        if not prompts:
            from engine.errors import InvalidSettingError
            raise InvalidSettingError("Choose a prompts file.")
        return LabConfig(
            prompts=prompts, model=self.model_edit.text().strip() or "embedded",
            draft=self.draft_edit.text().strip() or None,
            methods=tuple(m for m, box in self.method_boxes.items() if box.isChecked()),
            concurrency=tuple(level for level, box in self.level_boxes.items() if box.isChecked()),
            max_tokens=self.max_tokens.value(), max_draft=self.max_draft.value(), adaptive=self.adaptive.isChecked(),
            threads=self.threads.value() or None, repeats=self.repeats.value())

    def start_run(self) -> None:
        try:
            config = self.config()
        except EngineError as exc:
            QMessageBox.warning(self, "Speculation lab", str(exc))
            return
        self._clear()
        self._cancel = threading.Event()
        self._set_running(True)
        self.status.setText("Loading the model…")
        if not self._thread.isRunning():  # started per run, stopped when the window closes
            self._thread.start()
        self._start.emit(config, self._cancel)

    def cancel_run(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.status.setText("Cancelling…")

    @property
    def running(self) -> bool:
        return self._cancel is not None

    def _set_running(self, running: bool) -> None:
        for w in (self.run_button, self.load_button, self.model_edit, self.draft_edit):
            w.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        self.save_button.setEnabled(not running and self.results is not None)

    def _clear(self) -> None:
        self.results = self.recommendation = None
        self.rate_chart.clear()
        self.itl_chart.clear()
        self.table.setRowCount(0)
        self.advice.setText("")
        self.apply_button.setEnabled(False)
        self.progress.setValue(0)

    @Slot(object)
    def _on_progress(self, p: LabProgress) -> None:
        self.progress.setValue(round(100 * p.fraction))
        self.status.setText(f"Cell {p.cell} of {p.cells}: {METHOD_WORDS[p.method]} at {p.concurrency} concurrent "
                            f"— {p.generated}/{p.expected} tokens, {p.elapsed_s:.1f} s")

    @Slot(object)
    def _on_cell(self, cell: dict) -> None:
        self.rate_chart.add(cell)
        self.itl_chart.add(cell)
        self._add_row(cell)

    @Slot(object)
    def _on_finished(self, results: dict) -> None:
        self._cancel = None
        self.progress.setValue(100)
        self.show_results(results, live=True)
        self.status.setText(f"Done: {len(results['cells'])} cells measured.")
        self._set_running(False)
        self.runFinished.emit(results)

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        self._cancel = None
        self._set_running(False)
        self.status.setText(f"The run failed: {message}")
        self.runFailed.emit(message)

    @Slot()
    def _on_cancelled(self) -> None:
        self._cancel = None
        self._set_running(False)
        self.status.setText("Cancelled: nothing was kept from the unfinished run.")
        self.runCancelled.emit()

    # --- results ------------------------------------------------------------------------------
    def show_results(self, results: dict, live: bool = False) -> None:
        """Chart, table and advice for a results document (just measured, or loaded)."""
        results = results if "advice" in results else with_analysis(results)
        self.results = results
        if not live:
            self._clear()
            self.results = results
            for cell in results["cells"]:
                self._on_cell(cell)
        for method in results.get("crossover", {}):
            cross = crossover(results, method)
            if cross and cross.stops_at is not None:
                self.rate_chart.mark(cross.estimate or cross.stops_at, f"{METHOD_WORDS[method]} stops paying")
        advice = results["advice"]
        self.recommendation = dict(advice["settings"])
        shown = ", ".join(f"{k.replace('_', ' ')}: {({True: 'on', False: 'off'}.get(v, v) if isinstance(v, bool) else v)}"
                          for k, v in self.recommendation.items())
        self.advice.setText("\n".join(advice["lines"]) + f"\n\nRecommended for the chat: {shown}.")
        self.apply_button.setEnabled(True)
        self._set_running(False)

    def _add_row(self, c: dict) -> None:
        util, mem = c.get("utilisation") or {}, c.get("memory") or {}
        util_text = f"{util.get('kind', '?')} {_fmt(util.get('percent'), '.0f')}%"
        mem_text = f"{mem.get('kind', '?')} {_fmt(mem.get('bytes') and mem['bytes'] / 2**30, '.2f')} GiB"
        acc = c.get("acceptance_rate")
        values = [METHOD_WORDS.get(c["method"], c["method"]), str(c["concurrency"]),
                  _fmt(c.get("aggregate_tokens_per_s"), ".1f"), _fmt(c.get("per_request_tokens_per_s"), ".1f"),
                  f"{_fmt(c.get('itl_p50_ms'), '.1f')} / {_fmt(c.get('itl_p95_ms'), '.1f')}",
                  f"{_fmt(c.get('e2e_p50_s'), '.2f')} / {_fmt(c.get('e2e_p95_s'), '.2f')}",
                  NA if acc is None else f"{acc:.0%} (mean length {c['mean_acceptance_length']:.2f})",
                  f"{util_text} · {mem_text}"]
        row = self.table.rowCount()
        self.table.insertRow(row)
        for col, text in enumerate(values):
            self.table.setItem(row, col, QTableWidgetItem(text))
        self.table.resizeColumnsToContents()

    def save_results(self, path: str | Path) -> None:
        if self.results is None:
            raise ValueError("There are no results to save yet.")
        Path(path).write_text(json.dumps(self.results, indent=1), encoding="utf-8")

    def load_results(self, path: str | Path) -> None:
        """Show a results.json from this window or from python -m engine.lab; raises ValueError if unreadable."""
        try:
            results = json.loads(Path(path).read_text(encoding="utf-8"))
            if not isinstance(results, dict) or not results.get("cells"):
                raise ValueError("it holds no lab results")
            self.show_results(results)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{Path(path).name} could not be read: {exc}") from exc
        self.progress.setValue(100)
        self.status.setText(f"Loaded {Path(path).name}.")

    def _save_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save lab results", "lab-results.json", "JSON (*.json)")
        if path:
            try:
                self.save_results(path)
            except (OSError, ValueError) as exc:
                QMessageBox.warning(self, "Speculation lab", f"Could not save: {exc}")

    def _load_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load lab results", "", "JSON (*.json)")
        if path:
            try:
                self.load_results(path)
            except ValueError as exc:
                QMessageBox.warning(self, "Speculation lab", str(exc))

    def _apply(self) -> None:
        if self.recommendation:
            self.applySettings.emit(dict(self.recommendation))
            self.status.setText("Recommended settings sent to the chat.")

    # --- closing ------------------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        """Closing cancels a run and stops the worker thread; the window can be shown and run again."""
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        self.cancel_run()
        self._thread.quit()  # after the run in progress notices the cancel, within a step
        self._thread.wait()
