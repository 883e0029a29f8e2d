"""Work on the model that runs outside the engine loop (a request's tokenizing, in the server's thread pool): the
server's stop waits for it, so the model is never closed under a tokenizer still reading it (a segfault)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class InFlight:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0

    def call(self, work: Callable[..., T], *args: object) -> T:
        """work(*args), counted while it runs."""
        with self._changed:
            self._running += 1
        try:
            return work(*args)
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing runs (True), or timeout seconds (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._running == 0, timeout)
