"""A FIFO that tells whether anything opened it for reading: the proof that rendered text loaded a local file.

Qt reads an image named in rich text synchronously on the GUI thread; from a FIFO that read would block the window
for ever. The trap's own thread keeps trying to open the FIFO's write end without blocking, which succeeds only
while a reader has it open; it then writes a few bytes and closes, so the reader gets them and an end of file, and
the test goes on to fail instead of hanging."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path


class FifoTrap:
    HOLD_S = 0.0  # how long the writer waits once a reader has opened the FIFO (a subclass makes reads slow)
    PAYLOAD = b"GIF89a"

    def __init__(self, path: Path):
        self.path = Path(path)
        os.mkfifo(self.path)
        self.opened = 0  # how many times a reader opened it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return self.path.as_uri()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no reader now
                    raise
                time.sleep(0.002)
                continue
            self.opened += 1
            time.sleep(self.HOLD_S)
            try:
                os.write(fd, self.PAYLOAD)
            except OSError:
                pass
            os.close(fd)
            time.sleep(0.01)  # let the reader see its end of file before the next open

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1)
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> FifoTrap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
