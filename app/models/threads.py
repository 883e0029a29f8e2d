"""Worker threads that outlive their window: a QThread destroyed while it runs aborts the process, so
the threads of the Models dialog's downloads and checks are kept here until they have finished, and so are the
main window's engine and token counter threads once it closes (it asks them to stop and does not wait)."""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QObject, QThread, Slot

STOP_WAIT_MS = 15_000  # a stalled connection notices a cancel within the hub client's read timeout


class ThreadKeeper(QObject):
    """Owns the worker threads: a worker is stopped and its thread kept until it has finished."""

    def __init__(self):
        super().__init__()
        self._running: list[tuple[QThread, QObject]] = []
        self._stopping: list[tuple] = []  # (thread, what it needs alive): asked to stop already, not waited for
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

    def keep(self, thread: QThread, *needed: QObject) -> None:
        """Hold a thread already asked to stop (and the objects it still uses) until it has finished."""
        thread.finished.connect(self._reap)
        self._stopping.append((thread, *needed))
        if thread.isFinished():
            self._reap()

    @Slot()
    def _reap(self) -> None:
        for kept in (self._running, self._stopping):
            for entry in [e for e in kept if e[0].isFinished()]:
                entry[0].wait()
                kept.remove(entry)

    @Slot()
    def stop_all(self) -> None:
        for _thread, worker in self._running:
            worker.stop()
        for thread, _ in self._running:
            thread.wait(STOP_WAIT_MS)
        self.wait_stopping()

    def wait_stopping(self) -> None:
        """Wait for the kept threads that were asked to stop: at exit, once the window is gone. No time limit: a
        model load cannot be interrupted, and the thread must end before Python destroys it."""
        for thread, *_ in list(self._stopping):
            thread.wait()
        self._reap()


_keeper: ThreadKeeper | None = None


def start_worker(worker: QObject, owner: QObject) -> tuple[QThread, QObject]:
    """Run worker.run() on a new kept thread; the worker is stopped if owner is deleted first."""
    return _the_keeper().start(worker, owner)


def keep_until_finished(thread: QThread, *needed: QObject) -> None:
    """Keep thread, asked to stop already, and what it uses, until it has finished; the app's exit waits for it."""
    _the_keeper().keep(thread, *needed)


def wait_for_stopping_threads() -> None:
    """Wait until every thread handed to keep_until_finished has ended (at exit; tests between windows)."""
    if _keeper is not None:
        _keeper.wait_stopping()


def _the_keeper() -> ThreadKeeper:
    global _keeper
    if _keeper is None:
        _keeper = ThreadKeeper()
    return _keeper


def stop_and_wait(running: tuple[QThread, QObject] | None) -> None:
    """Stop a worker and wait (a while) for its thread to end."""
    if running is not None:
        running[1].stop()
        running[0].wait(STOP_WAIT_MS)
