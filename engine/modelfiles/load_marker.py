"""A note on disk saying which model is being loaded, removed when the load ends either way.

If SpecChat dies while loading (an abort no check foresaw, a GPU out-of-memory kill), the note is
still there at the next start, which then starts without that model and says why, instead of
loading it again and dying on every launch.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..paths import data_dir, write_text_atomic

FILE_NAME = "loading.json"
log = logging.getLogger(__name__)


class LoadMarker:
    def __init__(self, path: Path | None = None):
        self._path = path

    @property
    def path(self) -> Path:
        return self._path or data_dir() / FILE_NAME

    def begin(self, role: str, model: str) -> None:
        """About to load `model` as `role` ("target" or "draft") in this process."""
        note = {"role": role, "model": str(model), "pid": os.getpid(), "started": time.time()}
        try:
            write_text_atomic(self.path, json.dumps(note))
        except OSError as exc:  # a read-only data folder: loading goes on, unguarded
            log.warning("could not write the loading marker %s: %s", self.path, exc)

    def end(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove the loading marker %s: %s", self.path, exc)

    def left_over(self) -> dict[str, Any] | None:
        """The note a crashed load left behind (and remove it), or None after a clean exit."""
        try:
            note = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            note = {}
        self.end()
        if not isinstance(note, dict) or note.get("role") not in ("target", "draft"):
            return None
        return note
