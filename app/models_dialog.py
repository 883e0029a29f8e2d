"""The Models dialog: get a catalog pair, see and manage installed models, pick target + draft.

Downloads and compatibility checks run on QThreads; the GUI thread only receives their signals.
A download stops (keeping what arrived) when the window closes; Resume continues it later.
The draft picker offers only drafts that pass llama.cpp's vocabulary check against the chosen
target; the others are listed greyed out with the reason.
"""
from __future__ import annotations

import html
import logging
import threading
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QObject, Qt, QThread, Signal, Slot
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDialog, QFileDialog, QFormLayout, QGroupBox,
                               QHBoxLayout, QHeaderView, QLabel, QMessageBox, QProgressBar, QPushButton,
                               QTableWidget, QTableWidgetItem, QTabWidget, QVBoxLayout, QWidget)

from engine import model_store
from engine.catalog import CatalogPair, load_catalog
from engine.downloads import DownloadCancelled, DownloadJob, FileRequest, Progress, format_bytes, partial_bytes
from engine.embedded import DESCRIPTION, EMBEDDED, resolve_model
from engine.errors import EngineError
from engine.vocab_check import Compatibility

log = logging.getLogger(__name__)

GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"
BAR_STEPS = 1000
STOP_WAIT_MS = 15_000  # a stalled connection notices a cancel within the hub client's read timeout


class DownloadWorker(QObject):
    progress = Signal(object)  # engine.downloads.Progress
    finished = Signal(list)  # local paths
    failed = Signal(str)
    stopped = Signal(str)

    def __init__(self, requests: list[FileRequest]):
        super().__init__()
        self.job = DownloadJob(requests, self.progress.emit)

    def stop(self) -> None:
        self.job.cancel()  # thread-safe; the job stops at the next piece of data

    @Slot()
    def run(self) -> None:
        try:
            paths = self.job.run()
        except DownloadCancelled as exc:
            self.stopped.emit(str(exc))
        except EngineError as exc:
            self.failed.emit(str(exc))
        except Exception as exc:  # noqa: BLE001 - a worker must always report back
            log.exception("download")
            self.failed.emit(f"The download failed unexpectedly: {exc}")
        else:
            self.finished.emit([str(p) for p in paths])
        QThread.currentThread().quit()


class CompatibilityWorker(QObject):
    checked = Signal(int, object)  # generation, {draft spec: Compatibility}

    def __init__(self, generation: int, target: str, drafts: list[str]):
        super().__init__()
        self.generation, self.target, self.drafts = generation, target, drafts
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    @Slot()
    def run(self) -> None:
        try:
            paths = {spec: resolve_model(spec) for spec in self.drafts}
            found = model_store.check_drafts(resolve_model(self.target), paths.values(), self._stop.is_set)
            results = {spec: found[path] for spec, path in paths.items() if path in found}
        except Exception as exc:  # noqa: BLE001 - report as a reason, never crash the dialog
            log.exception("compatibility check")
            results = {spec: Compatibility(False, f"could not be checked: {exc}") for spec in self.drafts}
        self.checked.emit(self.generation, results)
        QThread.currentThread().quit()


class ModelsDialog(QDialog):
    modelsChosen = Signal(str, object)  # target path or "embedded", draft path or None
    downloadFinished = Signal(list)
    downloadStopped = Signal(str)  # cancelled or failed, with the message shown
    compatibilityChecked = Signal()

    def __init__(self, current_target: str, current_draft: str | None, parent=None, *,
                 catalog: list[CatalogPair] | None = None):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(900, 640)
        self._current_target = str(current_target or EMBEDDED)
        self._current_draft = current_draft
        self._catalog_error = ""
        try:
            self.catalog = load_catalog() if catalog is None else catalog
        except EngineError as exc:
            self.catalog, self._catalog_error = [], str(exc)
        self._download: tuple[QThread, DownloadWorker] | None = None
        self._download_pair: CatalogPair | None = None
        self._check: tuple[QThread, CompatibilityWorker] | None = None
        self._compat: dict[str, Compatibility] = {}
        self._compat_target: str | None = None
        self._compat_generation = 0  # bumps whenever the target or the candidates change

        tabs = QTabWidget()
        tabs.addTab(self._build_catalog_tab(), "Get a pair")
        tabs.addTab(self._build_installed_tab(), "Installed")
        layout = QVBoxLayout(self)
        layout.addWidget(tabs, 1)
        layout.addWidget(self._build_choice_box())
        self.refresh()

    # --- layout -------------------------------------------------------------------------------
    def _build_catalog_tab(self) -> QWidget:
        tab = QWidget()
        self.pairs_table = _table(["Pair", "Download size", "Status"])
        self.pairs_table.itemSelectionChanged.connect(self._pair_selected)
        self.pair_details = QLabel(self._catalog_error or "Choose a pair to see what it contains.")
        self.pair_details.setWordWrap(True)
        self.pair_details.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.download_button = QPushButton("Download pair")
        self.download_button.setToolTip("Downloads the target and its draft. Closing this window stops the "
                                        "download; it resumes where it stopped.")
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_download)
        self.target_bar, self.draft_bar = QProgressBar(), QProgressBar()
        self.target_bar_label, self.draft_bar_label = QLabel("Target"), QLabel("Draft")
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        buttons = QHBoxLayout()
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        bars = QFormLayout()
        bars.addRow(self.target_bar_label, self.target_bar)
        bars.addRow(self.draft_bar_label, self.draft_bar)
        layout = QVBoxLayout(tab)
        layout.addWidget(self.pairs_table, 1)
        layout.addWidget(self.pair_details)
        layout.addLayout(buttons)
        layout.addLayout(bars)
        layout.addWidget(self.status_label)
        return tab

    def _build_installed_tab(self) -> QWidget:
        tab = QWidget()
        self.installed_table = _table(["Model", "Size", "Location", "Source"])
        self.installed_table.itemSelectionChanged.connect(self._installed_selected)
        self.add_button = QPushButton("Add GGUF file…")
        self.add_button.clicked.connect(self.add_local_files)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_selected)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.delete_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(tab)
        layout.addWidget(self.installed_table, 1)
        layout.addLayout(buttons)
        return tab

    def _build_choice_box(self) -> QGroupBox:
        box = QGroupBox("Use these models")
        self.target_combo = QComboBox()
        self.target_combo.currentIndexChanged.connect(self._target_changed)
        self.draft_combo = QComboBox()
        self.draft_model = QStandardItemModel(self.draft_combo)
        self.draft_combo.setModel(self.draft_model)
        self.draft_combo.activated.connect(self._draft_picked)
        self.draft_note = QLabel("")
        self.draft_note.setWordWrap(True)
        self.apply_button = QPushButton("Use these models")
        self.apply_button.setDefault(True)
        self.apply_button.clicked.connect(self.apply)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        form = QFormLayout()
        form.addRow("Target", self.target_combo)
        form.addRow("Draft", self.draft_combo)
        form.addRow("", self.draft_note)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.apply_button)
        buttons.addWidget(close)
        layout = QVBoxLayout(box)
        layout.addLayout(form)
        layout.addLayout(buttons)
        return box

    # --- state --------------------------------------------------------------------------------
    def refresh(self, select_target: str | None = None) -> None:
        """Re-read what is installed and redraw the tables and pickers."""
        try:
            self.installed = model_store.list_models()
        except EngineError as exc:
            self.installed = []
            self._show_status(str(exc), error=True)
        self._fill_pairs()
        self._fill_installed()
        self._fill_targets(select_target)
        self._update_buttons()

    def _fill_pairs(self) -> None:
        selected = self._selected_pair()
        self.pairs_table.setRowCount(len(self.catalog))
        for row, pair in enumerate(self.catalog):
            name = pair.name if pair.verified else f"{pair.name} (file names not verified)"
            _set_row(self.pairs_table, row, [name, f"about {format_bytes(pair.size_bytes)}", self._pair_status(pair)],
                     data=pair.id, tooltip=pair.note)
            if selected is not None and pair.id == selected.id:
                self.pairs_table.selectRow(row)

    def _pair_status(self, pair: CatalogPair) -> str:
        state = model_store.pair_state(pair)
        if state == "installed":
            return "Installed"
        if state == "partial":
            done = sum(partial_bytes(r) for r in model_store.catalog_requests(pair))
            return f"Partly downloaded ({format_bytes(done)} so far)" if done else "Partly downloaded"
        return "Not downloaded"

    def _fill_installed(self) -> None:
        self.installed_table.setRowCount(len(self.installed))
        for row, model in enumerate(self.installed):
            source = model.repo_id if model.origin == model_store.DOWNLOADED else "added from disk"
            _set_row(self.installed_table, row, [model.name, format_bytes(model.size_bytes), str(model.location),
                                                 source], data=str(model.path), tooltip=str(model.path))

    def _fill_targets(self, select: str | None = None) -> None:
        keep = select or self.target_combo.currentData() or self._current_target
        self.target_combo.blockSignals(True)
        self.target_combo.clear()
        self.target_combo.addItem("Embedded demo model (SmolLM2 135M Instruct)", EMBEDDED)
        self.target_combo.setItemData(0, DESCRIPTION, Qt.ToolTipRole)
        for model in self.installed:
            self.target_combo.addItem(f"{model.name} ({format_bytes(model.size_bytes)})", str(model.path))
        if self.target_combo.findData(keep) < 0:
            self.target_combo.addItem(f"{Path(keep).name} (current)", keep)  # e.g. chosen in Settings
        self.target_combo.setCurrentIndex(max(self.target_combo.findData(keep), 0))
        self.target_combo.blockSignals(False)
        self._target_changed()

    def _draft_candidates(self, target: str) -> list[str]:
        candidates = [EMBEDDED] + [str(m.path) for m in self.installed]
        if self._current_draft and self._current_draft not in candidates:
            candidates.append(self._current_draft)
        return [c for c in candidates if c != target]

    def _target_changed(self) -> None:
        target = self.target_combo.currentData()
        if target is None:
            return
        self._compat, self._compat_target = {}, target
        self._compat_generation += 1
        self._fill_drafts(checking=True)
        self._start_check()
        self._update_buttons()

    def _draft_picked(self) -> None:
        self._current_draft = self.draft_combo.currentData()  # kept across target changes if still usable

    def _fill_drafts(self, checking: bool = False) -> None:
        previous = self._current_draft
        self.draft_model.clear()
        self.draft_model.appendRow(_item("None (no draft model)", None))
        unusable = []
        for spec in self._draft_candidates(self._compat_target or EMBEDDED):
            result = self._compat.get(spec)
            name = "embedded demo model" if spec == EMBEDDED else Path(spec).name
            if result is None:
                continue
            if result.ok:
                self.draft_model.appendRow(_item(name, spec))
            else:
                unusable.append(f"{name}: {result.reason}")
                self.draft_model.appendRow(_item(f"{name} (not usable: {result.reason})", spec, enabled=False))
        index = self.draft_combo.findData(previous) if previous else 0
        usable = index >= 0 and bool(self.draft_model.item(index).isEnabled())
        self.draft_combo.setCurrentIndex(index if usable else 0)
        if checking:
            self.draft_note.setText("Checking which drafts can serve this target…")
        elif unusable:
            self.draft_note.setText("Not usable with this target (llama.cpp's vocabulary rules):\n"
                                    + "\n".join(unusable))
        else:
            self.draft_note.setText("")

    def _start_check(self) -> None:
        if self._check is not None:
            self._check[1].stop()  # its answer is out of date; _check_done starts the next check
            return
        target = self._compat_target
        worker = CompatibilityWorker(self._compat_generation, target, self._draft_candidates(target))
        worker.checked.connect(self._check_done)
        self._check = _start(worker, self)

    @Slot(int, object)
    def _check_done(self, generation: int, results: dict) -> None:
        thread, _ = self._check
        thread.wait()
        self._check = None
        if generation != self._compat_generation:
            self._start_check()
            return
        self._compat = results
        self._fill_drafts()
        self._update_buttons()
        self.compatibilityChecked.emit()

    # --- downloads ----------------------------------------------------------------------------
    def _selected_pair(self) -> CatalogPair | None:
        rows = self.pairs_table.selectionModel().selectedRows() if self.pairs_table.selectionModel() else []
        if not rows:
            return None
        pair_id = self.pairs_table.item(rows[0].row(), 0).data(Qt.UserRole)
        return next((p for p in self.catalog if p.id == pair_id), None)

    def _pair_selected(self) -> None:
        pair = self._selected_pair()
        if pair is not None:
            e = html.escape
            files = "<br>".join(f"{role}: {e(f.repo_id)} / {e(f.filename)} ({e(f.quantization)}, about "
                                f"{format_bytes(f.size_bytes)})" for role, f in (("Target", pair.target),
                                                                               ("Draft", pair.draft)))
            verified = "" if pair.verified else "<br><i>These file names were not verified.</i>"
            self.pair_details.setText(f"<b>{e(pair.name)}</b> — {e(pair.family)}, chat format: "
                                      f"{e(pair.chat_template)}<br>{e(pair.note)}<br>{files}{verified}")
            self.target_bar_label.setText(f"Target: {pair.target.filename}")
            self.draft_bar_label.setText(f"Draft: {pair.draft.filename}")
        self._update_buttons()

    def start_download(self) -> None:
        pair = self._selected_pair()
        if pair is None or self._download is not None:
            return
        self._download_pair = pair
        for bar in (self.target_bar, self.draft_bar):
            bar.setRange(0, BAR_STEPS)
            bar.setValue(0)
        worker = DownloadWorker(model_store.catalog_requests(pair))
        worker.progress.connect(self._download_progress)
        worker.finished.connect(self._download_finished)
        worker.failed.connect(self._download_failed)  # bound methods: delivered on the GUI thread
        worker.stopped.connect(self._download_stopped)
        self._show_status(f"Asking the hub about {pair.name}…")
        self._download = _start(worker, self)
        self._update_buttons()

    def cancel_download(self) -> None:
        if self._download is not None:
            self._download[1].stop()
            self._show_status("Stopping…")
            self.cancel_button.setEnabled(False)

    @Slot(object)
    def _download_progress(self, p: Progress) -> None:
        bars = (self.target_bar, self.draft_bar)
        if p.phase != "checking":  # files arrive in order once the hub has been asked about all of them
            for bar in bars[:p.file_index]:
                bar.setValue(BAR_STEPS)
            if p.file_total:
                bars[min(p.file_index, 1)].setValue(int(BAR_STEPS * p.file_done / p.file_total))
        total = format_bytes(p.total_bytes) if p.total_bytes else "?"
        if p.phase == "checking":
            text = f"Asking the hub about {p.filename}…"
        elif p.phase == "verifying":
            text = f"Checking the sha256 of {p.filename}…"
        elif p.phase == "done":
            text = "Done."
        else:
            text = f"Downloading {p.filename}: {format_bytes(p.done_bytes)} of {total}"
            if p.speed_bps:
                text += f" · {format_bytes(p.speed_bps)}/s"
            if p.eta_s is not None:
                text += f" · {p.eta_text} left"
        self._show_status(text)

    @Slot(list)
    def _download_finished(self, paths: list) -> None:
        self._end_download()
        for bar in (self.target_bar, self.draft_bar):
            bar.setValue(BAR_STEPS)
        self._show_status(f"Installed {self._download_pair.name}. It is selected below: press "
                          "“Use these models” to chat with it.")
        self._current_draft = paths[1]  # preselected once its compatibility is confirmed
        self.refresh(select_target=paths[0])
        self.downloadFinished.emit(paths)

    @Slot(str)
    def _download_failed(self, message: str) -> None:
        self._download_ended(message, error=True)

    @Slot(str)
    def _download_stopped(self, message: str) -> None:
        self._download_ended(message, error=False)

    def _download_ended(self, message: str, error: bool) -> None:
        self._end_download()
        self._show_status(message, error=error)
        self.refresh()
        self.downloadStopped.emit(message)

    def _end_download(self) -> None:
        thread, _ = self._download
        thread.wait()
        self._download = None

    # --- installed models ---------------------------------------------------------------------
    def _selected_model(self) -> model_store.InstalledModel | None:
        rows = self.installed_table.selectionModel().selectedRows() if self.installed_table.selectionModel() else []
        if not rows:
            return None
        path = self.installed_table.item(rows[0].row(), 0).data(Qt.UserRole)
        return next((m for m in self.installed if str(m.path) == path), None)

    def _installed_selected(self) -> None:
        model = self._selected_model()
        local = model is not None and model.origin == model_store.LOCAL
        self.delete_button.setText("Remove from list" if local else "Delete")
        self._update_buttons()

    def add_local_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add GGUF models", str(Path.home()), GGUF_FILTER)
        problems = []
        for path in paths:
            try:
                model_store.add_local_model(path)
            except EngineError as exc:
                problems.append(str(exc))
        self.refresh()
        if problems:
            QMessageBox.warning(self, "Add GGUF file", "Not added:\n\n" + "\n\n".join(problems))

    def delete_selected(self) -> None:
        model = self._selected_model()
        if model is None:
            return
        if model.origin == model_store.LOCAL:
            question = f"Remove {model.name} from the list?\n\nThe file stays where it is:\n{model.path}"
        else:
            question = f"Delete {model.name} ({format_bytes(model.size_bytes)}) from disk?\n\n{model.path}"
        if QMessageBox.question(self, "Models", question) != QMessageBox.Yes:
            return
        try:
            model_store.delete_model(model.path)
        except (EngineError, OSError) as exc:
            QMessageBox.warning(self, "Models", f"{model.name} could not be removed: {exc}")
        self.refresh()

    # --- choice -------------------------------------------------------------------------------
    def apply(self) -> None:
        target = self.target_combo.currentData() or EMBEDDED
        draft = self.draft_combo.currentData()
        self.modelsChosen.emit(target, draft)
        if self._download is None:
            self.accept()
        else:
            self._show_status("Now using the chosen models; the download goes on.")

    def _update_buttons(self) -> None:
        downloading = self._download is not None
        pair = self._selected_pair()
        self.download_button.setEnabled(pair is not None and not downloading)
        if pair is not None and not downloading:
            state = model_store.pair_state(pair)
            self.download_button.setText({"installed": "Check for updates", "partial": "Resume"}.get(
                state, "Download pair"))
        self.cancel_button.setEnabled(downloading)
        self.delete_button.setEnabled(self._selected_model() is not None)
        self.apply_button.setEnabled(self._check is None)

    def _show_status(self, text: str, error: bool = False) -> None:
        self.status_label.setStyleSheet("color: #b00020;" if error else "")
        self.status_label.setText(text)

    def closeEvent(self, event) -> None:
        self._stop_workers()
        super().closeEvent(event)

    def done(self, result: int) -> None:  # Close, Escape and Apply all end here
        self._stop_workers()
        super().done(result)

    def _stop_workers(self) -> None:
        """Threads must end before the window goes; a stopped download keeps what arrived."""
        for running in (self._download, self._check):
            if running is not None:
                running[1].stop()
                running[0].wait(STOP_WAIT_MS)


class _ThreadKeeper(QObject):
    """Owns the worker threads, so that a window going away never destroys a running QThread
    (which aborts the process): a worker is stopped and its thread kept until it has finished."""

    def __init__(self):
        super().__init__()
        self._running: list[tuple[QThread, QObject]] = []
        QCoreApplication.instance().aboutToQuit.connect(self.stop_all)

    def start(self, worker: QObject, window: QObject) -> tuple[QThread, QObject]:
        thread = QThread()
        worker.moveToThread(thread)
        thread.started.connect(worker.run)
        thread.finished.connect(self._reap)  # a slot of this GUI-thread object: runs on the GUI thread
        window.destroyed.connect(lambda *_: worker.stop())  # a window deleted unclosed stops its work
        self._running.append((thread, worker))
        thread.start()
        return thread, worker

    @Slot()
    def _reap(self) -> None:
        for entry in [e for e in self._running if e[0].isFinished()]:
            entry[0].wait()
            self._running.remove(entry)

    @Slot()
    def stop_all(self) -> None:
        for thread, worker in self._running:
            worker.stop()
        for thread, _ in self._running:
            thread.wait(STOP_WAIT_MS)


_keeper: _ThreadKeeper | None = None


def _start(worker: QObject, window: QObject) -> tuple[QThread, QObject]:
    global _keeper
    if _keeper is None:
        _keeper = _ThreadKeeper()
    return _keeper.start(worker, window)


def _table(headers: list[str]) -> QTableWidget:
    table = QTableWidget(0, len(headers))
    table.setHorizontalHeaderLabels(headers)
    table.setSelectionBehavior(QAbstractItemView.SelectRows)
    table.setSelectionMode(QAbstractItemView.SingleSelection)
    table.setEditTriggers(QAbstractItemView.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeToContents)
    header.setSectionResizeMode(0, QHeaderView.Stretch)
    return table


def _set_row(table: QTableWidget, row: int, cells: list[str], data: str, tooltip: str) -> None:
    for column, text in enumerate(cells):
        item = QTableWidgetItem(text)
        item.setToolTip(tooltip)
        if column == 0:
            item.setData(Qt.UserRole, data)
        table.setItem(row, column, item)


def _item(text: str, data, enabled: bool = True) -> QStandardItem:
    item = QStandardItem(text)
    item.setData(data, Qt.UserRole)
    item.setToolTip(text)
    item.setEnabled(enabled)
    return item
