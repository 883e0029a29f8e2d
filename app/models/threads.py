"""The long-lived threads that outlive their window: the engine worker's and the token counter's (app/worker.py,
app/chat/context_meter.py). A window that closes asks them to stop and does not wait; a QThread destroyed while it
runs aborts the process, so they are kept here until they have finished, and the app's exit waits for them.
Background jobs (app.background) need none of this: Qt's pools own their threads."""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QObject, QThread, Slot

from app.background import wait_for_jobs


class ThreadKeeper(QObject):
    """Holds the threads asked to stop until they have finished."""

    def __init__(self):
        super().__init__()
        self._stopping: list[tuple] = []  # (thread, what it needs alive): asked to stop already, not waited for
        QCoreApplication.instance().aboutToQuit.connect(self.wait_stopping)

    def keep(self, thread: QThread, *needed: QObject) -> None:
        """Hold a thread already asked to stop (and the objects it still uses) until it has finished."""
        thread.finished.connect(self._reap)  # a slot of this GUI-thread object: runs on the GUI thread
        self._stopping.append((thread, *needed))
        if thread.isFinished():
            self._reap()

    @Slot()
    def _reap(self) -> None:
        for entry in [e for e in self._stopping if e[0].isFinished()]:
            entry[0].wait()
            self._stopping.remove(entry)

    @Slot()
    def wait_stopping(self) -> None:
        """Wait for the kept threads: at exit, once the window is gone. No time limit: a model load cannot be
        interrupted, and the thread must end before Python destroys it."""
        for thread, *_ in list(self._stopping):
            thread.wait()
        self._reap()


_keeper: ThreadKeeper | None = None


def keep_until_finished(thread: QThread, *needed: QObject) -> None:
    """Keep thread, asked to stop already, and what it uses, until it has finished; the app's exit waits for it."""
    global _keeper
    if _keeper is None:
        _keeper = ThreadKeeper()
    _keeper.keep(thread, *needed)


def wait_for_stopping_threads() -> None:
    """Wait until every thread handed to keep_until_finished has ended, and every background job but the daemon ones
    (tests between windows)."""
    if _keeper is not None:
        _keeper.wait_stopping()
    wait_for_jobs()
