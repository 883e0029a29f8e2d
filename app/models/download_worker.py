"""The download job runner: one engine.modelfiles.downloads.DownloadJob on a worker thread, reporting by signals."""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.errors import EngineError
from engine.modelfiles.downloads import DownloadCancelled, DownloadJob, FileRequest

log = logging.getLogger(__name__)


class DownloadWorker(QObject):
    progress = Signal(object)  # engine.modelfiles.downloads.Progress
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
