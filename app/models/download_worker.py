"""A download: one engine.modelfiles.downloads.DownloadJob off the GUI thread (app.background), its progress and
its end told to the window on the GUI thread."""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject

from app.background import Job
from engine.errors import EngineError
from engine.modelfiles.downloads import DownloadJob, Progress
from engine.modelfiles.hub_files import DownloadCancelled, FileRequest

log = logging.getLogger(__name__)


def start_download(
    requests: list[FileRequest],
    owner: QObject,
    *,
    progress: Callable[[Progress], None],
    finished: Callable[[list[str]], None],
    failed: Callable[[str], None],
    stopped: Callable[[str], None],
) -> Job:
    """Download requests in the background: progress(Progress) as it goes, then finished(local paths), failed(why) or
    stopped(what was kept). job.stop() stops it at the next piece of data."""

    def ended(exc: BaseException) -> None:
        if isinstance(exc, DownloadCancelled):
            stopped(str(exc))
        elif isinstance(exc, EngineError):
            failed(str(exc))
        else:
            log.error("download", exc_info=exc)
            failed(f"The download failed unexpectedly: {exc}")

    job = Job(
        progress=progress,
        done=lambda paths: finished([str(p) for p in paths]),
        failed=ended,
        owner=owner,
        name="download",
    )
    download = DownloadJob(requests, job.report)
    job.on_stop = download.cancel  # thread-safe; the download stops at the next piece of data
    return job.start(download.run)
