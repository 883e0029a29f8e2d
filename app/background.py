"""Work off the GUI thread, its answer back on the GUI thread: the one way the window runs a job in the background.

In the spirit of Anki's QueryOp: run_in_background(work, *args, done=..., failed=...) runs work(*args) on one of
Qt's thread pools, then calls done(its result), or failed(the exception it raised), on the GUI thread, through a
queued signal of a Job that lives there (succeeded / failed / reported): never inside the call that started it,
never on the worker's thread. A Job may be

- stopped (job.stop()): its stop_event is set, which work that can stop checks (job.stopped(), or the event
  itself), and its on_stop is called; its answer still comes, whatever the work made of the stop;
- cancelled (job.cancel()): stopped, and its answer dropped: a newer job has made it stale;
- owned (owner=a QObject): deleting the owner cancels it, so no answer reaches a window that is gone;
- in a lane (lane="name"): the lane's jobs run one at a time, in the order they were started (the files attached
  to a message, the conversation files imported, the code blocks coloured, the context meter's tokenizer);
- reporting (progress=fn): work calls job.report(value) on its way, and fn(value) follows on the GUI thread.

At exit: when the app quits every job is asked to stop (a download, a check, a lab run end within a step), and the
exit waits for the jobs still running (an import being stored ends whole), as PySide's own exit would: it deletes
the pools, whose destructor waits. A job that waits on something outside (a server far away, a keyring's unlock
prompt) is daemon=True instead: it runs on a daemon thread of Python's, which the exit leaves behind, since a pool's
thread that never ends would keep the app from quitting; its answer comes back the same way.

Not jobs: the engine worker and the token counter, which hold a loaded model (a vocabulary) for as long as the
window is open and take its work in order, each on a thread of its own (app/worker.py, app/chat/context_meter.py).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, Qt, QThreadPool, Signal, Slot
from shiboken6 import isValid

log = logging.getLogger(__name__)

POOL_THREADS = 32  # jobs outside a lane at once: most wait on a disk or a network, not on a core

_pool: QThreadPool | None = None  # the jobs outside a lane
_lanes: dict[str, QThreadPool] = {}  # a pool of one thread per lane: its jobs in order
_running: set[Job] = set()  # every job started and not answered yet: kept alive until its answer is delivered


class _Deliveries(QObject):
    """The GUI thread's end of every job: the workers emit here and Qt queues the call to the GUI thread. One object
    for all jobs, made once on the GUI thread: a job let go as its answer is delivered is not the object Qt is
    delivering to."""

    ended = Signal(object, object, object)  # job, result, exception
    reported = Signal(object, object)  # job, value

    def __init__(self):
        super().__init__()
        # Always queued, even when the work ended before start() returned: an answer never arrives inside the call
        # that asked for it.
        self.ended.connect(self._ended, Qt.ConnectionType.QueuedConnection)
        self.reported.connect(self._reported, Qt.ConnectionType.QueuedConnection)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(stop_all)

    @Slot(object, object, object)
    def _ended(self, job: Job, result, error) -> None:
        _running.discard(job)
        job._deliver(result, error)

    @Slot(object, object)
    def _reported(self, job: Job, value) -> None:
        job._deliver_report(value)


_deliveries: _Deliveries | None = None


class Job(QObject):
    """One piece of work off the GUI thread and its answer on it. Make it and start() it on the GUI thread."""

    succeeded = Signal(object)  # the work's result
    failed = Signal(object)  # the exception the work raised
    reported = Signal(object)  # what the work reported on its way (job.report)

    def __init__(
        self,
        *,
        done: Callable[[Any], object] | None = None,
        failed: Callable[[Any], object] | None = None,
        progress: Callable[[Any], object] | None = None,
        owner: QObject | None = None,
        lane: str | None = None,
        daemon: bool = False,
        on_stop: Callable[[], object] | None = None,
        name: str = "",
    ):
        super().__init__()
        self.lane, self.daemon = lane, daemon
        self.name = name or lane or "background"
        self.stop_event = threading.Event()  # set by stop(): work that can stop checks it
        self.on_stop = on_stop  # how to ask the work to stop, besides stop_event (may be set before start)
        self._owner = owner
        self._dropped = False  # cancelled: the answer goes to no one
        self._over = threading.Event()  # the work has returned (or raised) and its answer is on its way
        self._quiet_failure = failed is not None  # a caller that handles failures logs them as it sees fit
        for signal, callback in ((self.succeeded, done), (self.failed, failed), (self.reported, progress)):
            if callback is not None:
                signal.connect(callback)
        if owner is not None:
            owner.destroyed.connect(self._owner_gone)

    # --- the GUI thread's side -------------------------------------------------------------------
    def start(self, work: Callable[..., object], *args) -> Job:
        """Run work(*args) in the background; its answer follows on this (the GUI) thread."""
        global _deliveries
        if _deliveries is None:
            _deliveries = _Deliveries()  # made here, on the GUI thread, so its slots run there
        self._deliveries = _deliveries
        _running.add(self)
        if self.daemon:
            threading.Thread(target=self._run, args=(work, args), daemon=True, name=self.name).start()
        else:
            _pool_for(self.lane).start(lambda: self._run(work, args))
        return self

    def stop(self) -> None:
        """Ask the work to stop (it stops if it checks stopped(), or through on_stop); its answer still comes."""
        self.stop_event.set()
        if self.on_stop is not None:
            self.on_stop()

    def cancel(self) -> None:
        """Stop the work, and drop its answer (and what it reports from now on)."""
        self._dropped = True
        self.stop()

    @property
    def running(self) -> bool:
        return not self._over.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the work has returned (not until its answer is delivered): True if it has."""
        return self._over.wait(timeout_s)

    def _deliver(self, result, error) -> None:
        self.on_stop = None  # the work is over: nothing to stop (and what on_stop holds is let go)
        if self._dropped or (self._owner is not None and not isValid(self._owner)):
            return
        if error is None:
            self.succeeded.emit(result)
            return
        if not self._quiet_failure:
            log.error("background job %s failed", self.name, exc_info=error)
        self.failed.emit(error)

    def _deliver_report(self, value) -> None:
        if not self._dropped and (self._owner is None or isValid(self._owner)):
            self.reported.emit(value)

    @Slot()
    def _owner_gone(self, *_args) -> None:
        self._owner = None  # (deleted: not asked again)
        self.cancel()

    # --- the worker's side ----------------------------------------------------------------------
    def stopped(self) -> bool:
        """Has the work been asked to stop? (Any thread.)"""
        return self.stop_event.is_set()

    def report(self, value) -> None:
        """Say how the work goes: progress(value) follows on the GUI thread. (Any thread.)"""
        self._deliveries.reported.emit(self, value)

    def _run(self, work: Callable[..., object], args: tuple) -> None:
        threading.current_thread().name = self.name
        try:
            result, error = work(*args), None
        except BaseException as exc:  # noqa: BLE001 - whatever happens, the GUI thread hears of it
            result, error = None, exc
        try:
            self._deliveries.ended.emit(self, result, error)
        finally:
            self._over.set()


def run_in_background(work: Callable[..., object], *args, **options) -> Job:
    """Job(**options).start(work, *args): work(*args) off the GUI thread; done(result) or failed(exception) on it."""
    return Job(**options).start(work, *args)


def _pool_for(lane: str | None) -> QThreadPool:
    global _pool
    if lane is None:
        if _pool is None:
            _pool = QThreadPool()
            _pool.setMaxThreadCount(POOL_THREADS)
        return _pool
    if lane not in _lanes:
        pool = QThreadPool()
        pool.setMaxThreadCount(1)  # one at a time, first started first (jobs of one priority run in order)
        _lanes[lane] = pool
    return _lanes[lane]


def stop_all() -> None:
    """The app is quitting: every job is asked to stop."""
    for job in list(_running):
        job.stop()


def wait_for_jobs() -> None:
    """Wait until every job but the daemon ones has returned (at exit; tests between windows). No time limit: a
    job that writes must end whole, and the ones that can stop were asked to (stop_all)."""
    for job in list(_running):
        if not job.daemon:
            job.wait()


atexit.register(wait_for_jobs)  # after PySide's own exit functions are registered: run before them
