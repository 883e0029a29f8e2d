"""Work that must not run on the GUI thread (reading a file a person chose, storing an import), with its answer
handed back on the GUI thread.

A Lane is one worker thread for one kind of work: jobs run in the order given, and each answer reaches its
callback on the GUI thread through a queued Qt signal, never inside the call that started the job. Python joins
these threads at exit, so a job that writes (an import's transaction) ends before the process does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from PySide6.QtCore import QObject, Qt, Signal, Slot

log = logging.getLogger(__name__)


class _GuiCalls(QObject):
    """Runs callables on the thread it lives in (the GUI thread): a worker emits `call`, Qt queues it there."""

    call = Signal(object)

    def __init__(self):
        super().__init__()
        # Always queued, even when emitted on the GUI thread (a job may end before run() returns): an answer
        # never arrives inside the call that asked for it.
        self.call.connect(self._run, Qt.ConnectionType.QueuedConnection)

    @Slot(object)
    def _run(self, fn) -> None:
        fn()


class Lane:
    """One background thread, started at the first job. run() must be called on the GUI thread."""

    def __init__(self, name: str):
        self.name = name
        self._calls: _GuiCalls | None = None
        self._executor: ThreadPoolExecutor | None = None

    def run(self, job: Callable, *args, then: Callable[[object], None]) -> None:
        """job(*args) on this lane's thread; then(its result) on the GUI thread. If job raises, then() gets the
        exception (logged here): an answer never goes missing."""
        if self._calls is None:
            self._calls = _GuiCalls()  # made here, on the GUI thread, so its slot runs there
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        calls = self._calls

        def done(future: Future) -> None:
            exc = future.exception()
            if exc is not None:
                log.error("background job on %s", self.name, exc_info=exc)
            result = exc if exc is not None else future.result()
            calls.call.emit(lambda: then(result))

        self._executor.submit(job, *args).add_done_callback(done)
