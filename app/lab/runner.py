"""Runs one lab at a time in the background (app.background) through engine.lab.local.run_lab (or
engine.lab.remote.run_remote_lab against servers), the same code as the CLI.
The window only starts, cancels and listens: every signal carries plain data. Cancel is the job's stop event,
which the engine checks every step."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.background import Job
from app.remote_answer import api_key
from engine.errors import EngineError, GenerationCancelled
from engine.lab.local import LabConfig, run_lab
from engine.lab.remote import RemoteLabConfig, run_remote_lab
from engine.lab.report import with_analysis
from engine.lab.schema import LabProgress

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.1  # at most ten progress signals a second
LAB_LANE = "lab"  # one run at a time


def measure(config: LabConfig | RemoteLabConfig, cancel: threading.Event, report: Callable[[tuple], None]) -> dict:
    """The lab's run, in the background: ("progress", LabProgress) and ("cell", a cell dict) reported on its way,
    then the results document, analysed. Raises GenerationCancelled once cancel is set."""
    last = 0.0

    def on_progress(p: LabProgress) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY_S or p.generated >= p.expected:
            last = now
            report(("progress", p))

    def on_cell(cell: dict) -> None:
        report(("cell", cell))

    if isinstance(config, RemoteLabConfig):  # the servers' keys: the chats' own (keyring), read here
        config.api_keys = {url: key for url in config.servers.values() if (key := api_key(url))}
        return with_analysis(run_remote_lab(config, on_progress, on_cell, cancel))
    return with_analysis(run_lab(config, on_progress, on_cell, cancel))


class LabRunner(QObject):
    """The GUI-side handle: starts and cancels the run, and says whether one is going on. Its signals come on the
    GUI thread, after `running` has been updated."""

    progress = Signal(object)  # LabProgress
    cellDone = Signal(object)  # a cell dict
    finished = Signal(object)  # the results document, analysed
    failed = Signal(str)
    cancelled = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self._job: Job | None = None

    @property
    def running(self) -> bool:
        return self._job is not None

    def start(self, config: LabConfig | RemoteLabConfig) -> None:
        job = Job(owner=self, lane=LAB_LANE, progress=self._reported, done=self._finished, failed=self._failed)
        self._job = job.start(measure, config, job.stop_event, job.report)

    def cancel(self) -> bool:
        """Ask the run in progress to stop (within a step); False when none is running."""
        if self._job is None:
            return False
        self._job.stop()
        return True

    def shutdown(self) -> None:
        """The window closes: the run in progress stops, and this waits for it (it notices within a step)."""
        job = self._job
        if job is not None:
            job.stop()
            job.wait()

    def _reported(self, what: tuple) -> None:
        kind, value = what
        (self.progress if kind == "progress" else self.cellDone).emit(value)

    def _finished(self, results: dict) -> None:
        self._job = None
        self.finished.emit(results)

    def _failed(self, exc: BaseException) -> None:
        self._job = None
        if isinstance(exc, GenerationCancelled):
            self.cancelled.emit()
        elif isinstance(exc, (EngineError, OSError, ValueError)):
            self.failed.emit(str(exc))
        else:  # a bug must reach the user
            log.error("lab run", exc_info=exc)
            self.failed.emit(f"The lab stopped with an unexpected error: {exc}")
