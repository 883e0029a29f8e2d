"""One engine call on a worker thread (a hub search, a header read, a look through the disk): the window
gets its result or its message by signal, and a newer call of the same kind makes an older answer stale."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.models.threads import start_worker, stop_and_wait
from engine.errors import EngineError

log = logging.getLogger(__name__)


class TaskWorker(QObject):
    done = Signal(int, object)  # generation, result
    failed = Signal(int, str)  # generation, message for a person

    def __init__(self, generation: int, call: Callable[[Callable[[], bool]], object]):
        super().__init__()
        self.generation, self.call = generation, call
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    @Slot()
    def run(self) -> None:
        try:
            result = self.call(self._stop.is_set)
        except EngineError as exc:
            self.failed.emit(self.generation, str(exc))
        except Exception as exc:  # noqa: BLE001 - a worker must always report back
            log.exception("background task")
            self.failed.emit(self.generation, f"Something went wrong: {exc}")
        else:
            self.done.emit(self.generation, result)
        QThread.currentThread().quit()


class Tasks(QObject):
    """Background calls by kind: starting one stops the kind's previous call, whose answer is then ignored."""

    def __init__(self, owner: QObject):
        super().__init__(owner)
        self._owner = owner
        self._running: dict[str, tuple] = {}
        self._generation = 0

    def start(self, kind: str, call, on_done: Callable[[object], None], on_failed: Callable[[str], None]) -> None:
        self.cancel(kind)
        self._generation += 1
        generation = self._generation
        worker = TaskWorker(generation, call)
        worker.done.connect(self._done)  # a bound slot of this GUI-thread object: delivered on the GUI thread
        worker.failed.connect(self._failed)
        self._running[kind] = (*start_worker(worker, self._owner), generation, on_done, on_failed)

    @Slot(int, object)
    def _done(self, generation: int, result) -> None:
        running = self._take(generation)
        if running is not None:
            running[3](result)

    @Slot(int, str)
    def _failed(self, generation: int, message: str) -> None:
        running = self._take(generation)
        if running is not None:
            running[4](message)

    def _take(self, generation: int):
        """The current call this answer belongs to (now idle), or None for a stale answer."""
        for kind, running in self._running.items():
            if running[2] == generation:
                del self._running[kind]
                return running
        return None

    def busy(self, kind: str) -> bool:
        return kind in self._running

    def cancel(self, kind: str) -> None:
        running = self._running.pop(kind, None)
        if running is not None:
            running[1].stop()

    def stop_all(self) -> None:
        """The window is closing: stop every call and wait (a while) for its thread."""
        for kind in list(self._running):
            thread, worker, *_ = self._running.pop(kind)
            stop_and_wait((thread, worker))
