"""Runs one lab at a time on its own QThread through engine.lab.local.run_lab (or engine.lab.remote.run_remote_lab
against servers), the same code as the CLI.
The window only starts, cancels and listens: every signal carries plain data. Cancel is a
threading.Event the engine checks every step."""

from __future__ import annotations

import logging
import threading
import time

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.remote_answer import api_key
from engine.errors import EngineError, GenerationCancelled
from engine.lab.local import LabConfig, run_lab
from engine.lab.remote import RemoteLabConfig, run_remote_lab
from engine.lab.report import with_analysis
from engine.lab.schema import LabProgress

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.1  # at most ten progress signals a second


class LabWorker(QObject):
    """Lives on the runner's thread and runs the lab there."""

    progress = Signal(object)  # LabProgress
    cellDone = Signal(object)  # a cell dict
    finished = Signal(object)  # the results document, analysed
    failed = Signal(str)
    cancelled = Signal()

    @Slot(object, object)
    def run(self, config: LabConfig | RemoteLabConfig, cancel: threading.Event) -> None:
        last = 0.0

        def on_progress(p: LabProgress) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S or p.generated >= p.expected:
                last = now
                self.progress.emit(p)

        try:
            if isinstance(config, RemoteLabConfig):  # the servers' keys: the chats' own (keyring), read here
                config.api_keys = {url: key for url in config.servers.values() if (key := api_key(url))}
                results = run_remote_lab(config, on_progress, self.cellDone.emit, cancel)
            else:
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


class LabRunner(QObject):
    """The GUI-side handle: owns the thread and the worker, and says whether a run is going on.
    Its signals are the worker's, delivered on the GUI thread after `running` has been updated."""

    progress = Signal(object)
    cellDone = Signal(object)
    finished = Signal(object)
    failed = Signal(str)
    cancelled = Signal()
    _start = Signal(object, object)  # to the worker: config, cancel event

    def __init__(self, parent=None):
        super().__init__(parent)
        self._cancel: threading.Event | None = None
        self._thread = QThread(self)
        self._worker = LabWorker()
        self._worker.moveToThread(self._thread)
        self._start.connect(self._worker.run)
        self._worker.progress.connect(self.progress)
        self._worker.cellDone.connect(self.cellDone)
        self._worker.finished.connect(self._finished)
        self._worker.failed.connect(self._failed)
        self._worker.cancelled.connect(self._cancelled)

    @property
    def running(self) -> bool:
        return self._cancel is not None

    def start(self, config: LabConfig) -> None:
        self._cancel = threading.Event()
        if not self._thread.isRunning():  # started per run, stopped when the window closes
            self._thread.start()
        self._start.emit(config, self._cancel)

    def cancel(self) -> bool:
        """Ask the run in progress to stop (within a step); False when none is running."""
        if self._cancel is None:
            return False
        self._cancel.set()
        return True

    def shutdown(self) -> None:
        self.cancel()
        self._thread.quit()  # after the run in progress notices the cancel, within a step
        self._thread.wait()

    @Slot(object)
    def _finished(self, results: dict) -> None:
        self._cancel = None
        self.finished.emit(results)

    @Slot(str)
    def _failed(self, message: str) -> None:
        self._cancel = None
        self.failed.emit(message)

    @Slot()
    def _cancelled(self) -> None:
        self._cancel = None
        self.cancelled.emit()
