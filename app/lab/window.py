"""The speculation lab window: run plain vs speculative decoding at rising concurrency on this
machine, watch the chart fill in, read the advice, and apply it to the chat.

Its parts live in app/lab/: the experiment form (form.py), the runner that measures in the background
(app.background) through engine.lab.local.run_lab, the same code as the CLI (runner.py), the charts (chart.py) and
the results table (results_table.py). This module lays them out, starts and cancels runs, and turns
results into advice; it also saves and loads results documents.
"""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.lab.chart import LabChart
from app.lab.form import CUSTOM, LEVELS, PROMPT_SETS, LabForm
from app.lab.results_table import LEGEND, NA, ResultsTable
from app.lab.runner import PROGRESS_EVERY_S, LabRunner
from app.lab.scope import ChatModels, apply_blocker, changes_words, chat_changes
from engine import safe_files
from engine.errors import EngineError
from engine.lab.local import LabConfig
from engine.lab.remote import RemoteLabConfig
from engine.lab.report import best_draft_length, crossover, method_words, throughput, with_analysis
from engine.lab.schema import LabProgress
from engine.methods import DRAFT_METHODS

__all__ = ["CUSTOM", "LEVELS", "NA", "PROGRESS_EVERY_S", "PROMPT_SETS", "LabChart", "LabWindow"]


MAX_RESULTS_BYTES = 64 << 20  # a results file is a few KB; more is not a lab's
RATE_TITLES = {True: "Decode throughput, every slot busy", False: "Aggregate throughput"}


def recommendation_words(results: dict, settings: dict) -> str:
    """The recommended chat settings in words, squared with the advice above them: the advice names the
    best *fixed* draft length k for one chat (engine.lab.report.best_draft_length), while the recommendation keeps
    adaptive drafting with the cap the lab ran, so both numbers are named and told apart."""
    if results.get("env", {}).get("remote"):
        return "The servers' speculation is set where they run: nothing here to apply to the chat."
    if not settings:  # the advice's last line says why (a tie, or measures that disagree)
        return ""
    method = settings.get("method", "none")
    if method == "none":
        return "Recommended for the chat: plain decoding (speculation off)."
    words = method_words(method)
    if method in DRAFT_METHODS and settings.get("draft"):
        words += f" ({Path(settings['draft']).name})"
    cap = settings.get("max_draft")
    if not settings.get("adaptive"):
        return f"Recommended for the chat: {words}, drafting {cap} tokens every step."
    text = f"Recommended for the chat: {words}, adaptive, drafting at most {cap} tokens a step (as the lab ran it)."
    try:
        k = best_draft_length(results, method)
    except (KeyError, TypeError, ValueError):  # a saved document from before these figures were kept
        k = None
    if k and k != cap:
        text += (
            f" k={k} above is the best fixed draft length for one chat, as measured. The chat does not draft "
            f"a fixed length: adaptive drafting picks each step's length from the acceptance it measures (a long "
            f"match drafts long), so {cap} is only its upper limit."
        )
    return text


class LabWindow(QWidget):
    """Pick models, methods, levels and prompts; run; read and apply the advice."""

    applySettings = Signal(dict)  # e.g. {"method": "lookup", "max_draft": 8, "adaptive": True}
    runFinished = Signal(object)  # the results document
    runCancelled = Signal()
    runFailed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Speculation lab")
        self.setWindowFlag(Qt.Window)
        self.results: dict | None = None
        self.recommendation: dict | None = None
        self.chat: ChatModels | None = None  # the chat's models and drafting, from set_chat_models
        self.changes: dict = {}  # what Apply sends: only what the lab measured and the chat does differently
        self._cells: list[dict] = []
        self._earlier: dict | None = None  # results shown before a run started, back if it is cancelled
        self._build()
        self.runner = LabRunner(self)
        self.runner.progress.connect(self._on_progress)
        self.runner.cellDone.connect(self._on_cell)
        self.runner.finished.connect(self._on_finished)
        self.runner.failed.connect(self._on_failed)
        self.runner.cancelled.connect(self._on_cancelled)
        self._set_running(False)

    # --- layout -------------------------------------------------------------------------------
    def _build(self) -> None:
        self.form = f = LabForm()
        # The form's fields under the window's own names, as callers and tests have always used them.
        self.model_edit, self.draft_edit, self.method_boxes, self.level_boxes = (
            f.model_edit,
            f.draft_edit,
            f.method_boxes,
            f.level_boxes,
        )
        self.prompt_combo, self.prompt_file, self.max_tokens, self.max_draft = (
            f.prompt_combo,
            f.prompt_file,
            f.max_tokens,
            f.max_draft,
        )
        self.adaptive, self.threads, self.repeats = f.adaptive, f.threads, f.repeats
        left = QVBoxLayout()
        left.addWidget(self.form)
        left.addLayout(self._build_buttons())
        left.addWidget(self.progress)
        left.addWidget(self.status)
        left.addStretch(1)
        grid = QGridLayout(self)
        grid.addLayout(left, 0, 0, 2, 1)
        grid.addLayout(self._build_charts(), 0, 1)
        grid.addLayout(self._build_results(), 1, 1)
        grid.addWidget(self._build_advice(), 2, 0, 1, 2)
        grid.setColumnStretch(1, 1)
        grid.setRowStretch(1, 1)  # room to spare goes to the table
        self.resize(1280, 800)  # the charts side by side and every results column in sight

    def _build_buttons(self) -> QHBoxLayout:
        """Run, Cancel, Save and Load; and the progress and status under them."""
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
        # Shown only while a run measures (an empty bar at rest looks like a text box); its room is kept.
        policy = self.progress.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        self.progress.setSizePolicy(policy)
        self.progress.hide()
        self.status = QLabel("Choose what to compare, then Run.")
        self.status.setWordWrap(True)
        return buttons

    def _build_charts(self) -> QHBoxLayout:
        self.rate_chart = LabChart(RATE_TITLES[True], "tokens/s", throughput)
        self.itl_chart = LabChart("Inter-token latency (p50)", "ms per token", "itl_p50_ms")
        charts = QHBoxLayout()
        charts.addWidget(self.rate_chart)
        charts.addWidget(self.itl_chart)
        return charts

    def _build_results(self) -> QVBoxLayout:
        self.table = ResultsTable()
        self.table_legend = QLabel(LEGEND)  # why aggregate and per-request tokens/s differ
        self.table_legend.setWordWrap(True)
        results_box = QVBoxLayout()
        results_box.addWidget(self.table, 1)
        results_box.addWidget(self.table_legend)
        return results_box

    def _build_advice(self) -> QGroupBox:
        """The advice, and Apply with what it changes in the chat (or why it is not offered)."""
        self.advice = QLabel("")
        self.advice.setWordWrap(True)
        self.advice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.apply_button = QPushButton("Apply recommended settings")
        self.apply_button.setEnabled(False)
        self.apply_button.clicked.connect(self._apply)
        self.apply_note = QLabel("")  # what Apply changes in the chat, or why it is not offered
        self.apply_note.setWordWrap(True)
        advice_box = QGroupBox("Advice")
        advice_layout = QVBoxLayout(advice_box)
        advice_layout.addWidget(self.advice)
        apply_row = QHBoxLayout()
        apply_row.addWidget(self.apply_note, 1)
        apply_row.addWidget(self.apply_button, alignment=Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop)
        advice_layout.addLayout(apply_row)
        return advice_box

    # --- running ------------------------------------------------------------------------------
    def config(self) -> LabConfig | RemoteLabConfig:
        """The experiment as chosen; raises InvalidSettingError (an EngineError) when it cannot run."""
        return self.form.config()

    def start_run(self) -> None:
        try:
            config = self.config()
        except EngineError as exc:
            QMessageBox.warning(self, "Speculation lab", str(exc))
            return
        self._earlier = self.results
        self._clear()
        remote = isinstance(config, RemoteLabConfig)
        for chart in (self.rate_chart, self.itl_chart):
            chart.x_axis.setTitleText("concurrent clients" if remote else "concurrent sequences")
        self.runner.start(config)
        self._set_running(True)
        self.status.setText("Warming the servers up…" if remote else "Loading the model…")

    def cancel_run(self) -> None:
        if self.runner.cancel():
            self.status.setText("Cancelling…")

    @property
    def running(self) -> bool:
        return self.runner.running

    def _set_running(self, running: bool) -> None:
        self.form.set_running(running)
        for w in (self.run_button, self.load_button):
            w.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        self.progress.setVisible(running)
        self.save_button.setEnabled(not running and self.results is not None)

    def _clear(self) -> None:
        self.results = self.recommendation = None
        self.changes = {}
        self._cells = []
        self.rate_chart.clear()
        self.itl_chart.clear()
        self.table.setRowCount(0)
        self.advice.setText("")
        self.apply_note.setText("")
        self.apply_button.setEnabled(False)
        self.progress.setValue(0)

    @Slot(object)
    def _on_progress(self, p: LabProgress) -> None:
        self.progress.setValue(round(100 * p.fraction))
        self.status.setText(
            f"Cell {p.cell} of {p.cells}: {method_words(p.method)} at {p.concurrency} concurrent "
            f"— {p.generated}/{p.expected} tokens, {p.elapsed_s:.1f} s"
        )

    @Slot(object)
    def _on_cell(self, cell: dict) -> None:
        # what throughput() plots: results saved before full load was measured have only the aggregate
        full = cell.get("full_tokens_per_s") is not None
        self.rate_chart.chart_.setTitle(RATE_TITLES[full])
        self.rate_chart.add(cell)
        self.itl_chart.add(cell)
        self._cells.append(cell)
        self.table.show_cells(self._cells)

    @Slot(object)
    def _on_finished(self, results: dict) -> None:
        self.progress.setValue(100)
        self._earlier = None
        self.show_results(results, live=True)
        self.status.setText(f"Done: {len(results['cells'])} cells measured.")
        self._set_running(False)
        self.runFinished.emit(results)

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        kept = self._restore_earlier()
        self._set_running(False)
        self.status.setText(f"The run failed: {message}" + (" The earlier results are shown again." if kept else ""))
        self.runFailed.emit(message)

    @Slot()
    def _on_cancelled(self) -> None:
        kept = self._restore_earlier()
        self._set_running(False)
        self.status.setText(
            "Cancelled: nothing was kept from the unfinished run"
            + ("; the earlier results are shown again." if kept else ".")
        )
        self.runCancelled.emit()

    def _restore_earlier(self) -> bool:
        """An unfinished run's cells go; the results shown before it started come back."""
        earlier, self._earlier = self._earlier, None
        self._clear()
        if earlier is not None:
            self.show_results(earlier)
        return earlier is not None

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
                self.rate_chart.mark(cross.estimate or cross.stops_at, method)
        advice = results["advice"]
        self.recommendation = dict(advice["settings"])
        words = recommendation_words(results, self.recommendation)
        self.advice.setText("\n".join(advice["lines"]) + ("\n\n" + words if words else ""))
        self._offer_apply()
        self._set_running(False)

    # --- the chat's models, and what Apply may change -------------------------------------------------------
    def set_chat_models(
        self, target: str, draft: str | None, method: str, max_draft: int | None = None, adaptive: bool | None = None
    ) -> None:
        """The chat's current models and speculation (its effective method: "none" while speculation is off). The
        form starts on them, so the lab measures what the chat runs; Apply is offered only for results of them."""
        self.chat = ChatModels(target, draft, method, max_draft, adaptive)
        if not self.running:
            self.form.use_chat(self.chat)
        if self.results is not None:
            self._offer_apply()

    def _offer_apply(self) -> None:
        """Apply on, with the changes it makes in words, only where the results are of the chat's models and the
        chat does something else; otherwise off, with the reason."""
        results, blocker = self.results or {}, None
        self.changes = {}
        if not self.recommendation:
            blocker = "Nothing to apply." if results else ""
        else:
            blocker = apply_blocker(results, self.chat)
        if blocker is None:
            assert self.recommendation and self.chat is not None  # apply_blocker found nothing missing
            self.changes = chat_changes(self.recommendation, self.chat)
            blocker = None if self.changes else "The chat already runs what the lab recommends: nothing to apply."
        self.apply_button.setEnabled(blocker is None)
        self.apply_note.setText(
            blocker
            if blocker is not None
            else f"Apply changes the chat's {changes_words(self.changes, self.chat)}; nothing else."
        )

    def save_results(self, path: str | Path) -> None:
        if self.results is None:
            raise ValueError("There are no results to save yet.")
        Path(path).write_text(json.dumps(self.results, indent=1), encoding="utf-8")

    def load_results(self, path: str | Path) -> None:
        """Show a results.json from this window or from python -m engine.lab; raises ValueError if unreadable."""
        try:  # only a regular file, and not past the limit: a FIFO or /dev/zero is refused (engine.safe_files)
            results = json.loads(safe_files.read_text(path, MAX_RESULTS_BYTES))
            if not isinstance(results, dict) or not results.get("cells"):
                raise ValueError("it holds no lab results")
            self.show_results(results)
        except safe_files.FileRefused as exc:
            raise ValueError(str(exc)) from exc
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
        if self.changes:
            self.applySettings.emit(dict(self.changes))
            self.status.setText(f"Sent to the chat: {changes_words(self.changes, self.chat)}.")

    # --- closing ------------------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        """Closing cancels a run and waits for it to stop; the window can be shown and run again."""
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        self.cancel_run()
        self.runner.shutdown()
