"""Worker threads that outlive their window: a QThread destroyed while it runs aborts the process, so
the threads of the Models dialog's downloads and checks are kept here until they have finished."""
from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QObject, QThread, Slot

STOP_WAIT_MS = 15_000  # a stalled connection notices a cancel within the hub client's read timeout


class ThreadKeeper(QObject):
    """Owns the worker threads: a worker is stopped and its thread kept until it has finished."""

    def __init__(self):
        super().__init__()
        self._running: list[tuple[QThread, QObject]] = []
        QCoreApplication.instance().aboutToQuit.connect(self.stop_all)

    def start(self, worker: QObject, owner: QObject) -> tuple[QThread, QObject]:
        thread = QThread()
        worker.moveToThread(thread)
        thread.started.connect(worker.run)
        thread.finished.connect(self._reap)  # a slot of this GUI-thread object: runs on the GUI thread
        owner.destroyed.connect(lambda *_: worker.stop())  # a window deleted unclosed stops its work
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


_keeper: ThreadKeeper | None = None


def start_worker(worker: QObject, owner: QObject) -> tuple[QThread, QObject]:
    """Run worker.run() on a new kept thread; the worker is stopped if owner is deleted first."""
    global _keeper
    if _keeper is None:
        _keeper = ThreadKeeper()
    return _keeper.start(worker, owner)


def stop_and_wait(running: tuple[QThread, QObject] | None) -> None:
    """Stop a worker and wait (a while) for its thread to end."""
    if running is not None:
        running[1].stop()
        running[0].wait(STOP_WAIT_MS)
