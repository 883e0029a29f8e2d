"""The Models dialog's background calls (a hub search, a header read, a look through the disk), by kind, on
app.background: the window gets each call's result or its message on the GUI thread, and a newer call of the same
kind makes an older answer stale."""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject

from app.background import Job
from engine.errors import EngineError

log = logging.getLogger(__name__)

STOP_WAIT_S = 15.0  # a closing dialog waits this long for a call it stopped: a stalled connection notices a cancel
# within the hub client's read timeout


def failure_text(exc: BaseException) -> str:
    """A background call's failure, for a person: an EngineError's own words, anything else logged and named."""
    if isinstance(exc, EngineError):
        return str(exc)
    log.error("background task", exc_info=exc)
    return f"Something went wrong: {exc}"


class Tasks(QObject):
    """Background calls by kind: starting one cancels the kind's previous call, whose answer is then dropped.
    call(stopped) gets a callable that says whether it should stop."""

    def __init__(self, owner: QObject):
        super().__init__(owner)
        self._owner = owner
        self._running: dict[str, tuple[int, Job]] = {}  # kind → (call number, its job)
        self._calls = 0

    def start(
        self,
        kind: str,
        call: Callable[[Callable[[], bool]], object],
        on_done: Callable[[object], None],
        on_failed: Callable[[str], None],
    ) -> None:
        self.cancel(kind)
        self._calls += 1
        n = self._calls

        def done(result: object) -> None:
            if self._ended(kind, n):
                on_done(result)

        def failed(exc: BaseException) -> None:
            if self._ended(kind, n):
                on_failed(failure_text(exc))

        job = Job(owner=self._owner, name=kind, done=done, failed=failed)
        self._running[kind] = (n, job)
        job.start(call, job.stopped)

    def _ended(self, kind: str, n: int) -> bool:
        """The kind's current call (number n) answered, and is idle now: True; False for a stale answer."""
        if kind not in self._running or self._running[kind][0] != n:
            return False
        del self._running[kind]
        return True

    def busy(self, kind: str) -> bool:
        return kind in self._running

    def cancel(self, kind: str) -> None:
        running = self._running.pop(kind, None)
        if running is not None:
            running[1].cancel()

    def stop_all(self) -> None:
        """The window is closing: cancel every call and wait (a while) for each to return."""
        for kind in list(self._running):
            _, job = self._running.pop(kind)
            job.cancel()
            job.wait(STOP_WAIT_S)
