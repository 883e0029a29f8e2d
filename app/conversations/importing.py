"""File → Import conversation…, with nothing slow on the GUI thread.

A conversation file may be 64 MB of crafted JSON, or a path to a FIFO or /dev/zero: reading, parsing and checking
it, and storing what it holds, all run on the import lane (app.background). The GUI thread only asks the person
about the file's settings (app.conversations.imported_settings) and shows the result. Storing uses a connection
made on the import thread (sqlite3 connections stay on the thread that made them), to the window's file.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEventLoop, QObject, Signal
from shiboken6 import isValid

from app.background import run_in_background
from app.conversations.files import ConversationFileError, add_conversation, read_conversation_file, settings_to_confirm
from app.conversations.store import BUSY_TIMEOUT_S, MEMORY, ConversationStore

log = logging.getLogger(__name__)

IMPORT_LANE = "conversation-import"  # one import at a time, in the order asked


class ThreadStore(ConversationStore):
    """The window's conversation file through a connection of the calling thread's own.

    ConversationStore.__init__ is skipped on purpose: the window's store has checked and migrated the file
    already, and marking answers "streaming" as interrupted would mark the one the window is writing now."""

    def __init__(self, path: Path):  # noqa: B026 - super().__init__ skipped, see above
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_S)  # autocommit, as the store
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")


def read_file(path: str) -> dict | ConversationFileError:
    """The checked conversation in path, or why it is refused (on the import thread)."""
    try:
        return read_conversation_file(Path(path))
    except ConversationFileError as exc:
        return exc


def store_conversation(store_path: Path, data: dict, dropped: tuple) -> int:
    """Add the checked conversation to the file at store_path, in one transaction; its id (on the import thread)."""
    store = ThreadStore(store_path)
    try:
        return add_conversation(store, data, dropped)
    finally:
        store.close()


def refusal(name: str, result: BaseException) -> str:
    """Why nothing was imported, for a person."""
    if isinstance(result, ConversationFileError):
        return str(result)
    if isinstance(result, sqlite3.Error):
        return f"The conversation could not be saved ({result}); nothing was imported."
    return f"{name} could not be imported: {str(result) or type(result).__name__}."


class ConversationImport(QObject):
    """Imports one file at a time. finished carries the new conversation's id, or a str saying why not."""

    finished = Signal(object)

    def __init__(
        self,
        store: ConversationStore,
        default_preset: Callable[[], str],
        ask: Callable[[str, dict], bool],
        parent: QObject | None = None,
    ):
        """ask(file name, settings) -> use them? It runs on the GUI thread, between the read and the store."""
        super().__init__(parent)
        self.store, self.default_preset, self.ask = store, default_preset, ask
        self.path: str | None = None  # the file being imported, if one is
        self._job = 0  # the import under way: answers of an abandoned one are dropped
        self._loop: QEventLoop | None = None

    @property
    def busy(self) -> bool:
        return self.path is not None

    def start(self, path: str) -> None:
        """Read, check and store path in the background; finished follows. Call on the GUI thread, when not busy."""
        self.path = str(path)
        self._job += 1
        self._in_background(read_file, self.path, then=lambda result, job=self._job: self._read(job, result))

    def _in_background(self, work, *args, then) -> None:
        """work(*args) on the import lane; then(its result, or the exception it raised) on the GUI thread."""

        def failed(exc: BaseException) -> None:
            log.error("an import failed on the import thread", exc_info=exc)
            then(exc)

        run_in_background(work, *args, lane=IMPORT_LANE, done=then, failed=failed, owner=self)

    def run(self, path: str) -> int | str:
        """start(path), and return its result once finished. The event loop runs meanwhile, as under a dialog: the
        window paints and answers while the file is read and stored on the import thread."""
        outcome: list = []

        def keep(result) -> None:
            outcome.append(result)

        self.finished.connect(keep)
        try:
            self.start(path)
            if not outcome:
                self._loop = QEventLoop()
                self._loop.exec()
        finally:
            self._loop = None
            self.finished.disconnect(keep)
        return outcome[0] if outcome else "The window closed before the import was done."

    def abandon(self) -> None:
        """The window is closing: its wait ends. A file still being read is not imported (no one is left to ask about
        its settings); one being stored is, whole (one transaction), and shown at the next start."""
        self.path = None
        self._job += 1
        if self._loop is not None:
            self._loop.quit()

    def _under_way(self, job: int) -> str | None:
        """The file of this import if it is still the one under way, else None (the window is gone, or closed
        meanwhile, or the import ended): its answers are then dropped."""
        return self.path if isValid(self) and job == self._job else None

    def _read(self, job: int, result) -> None:
        path = self._under_way(job)
        if path is None:
            return
        if isinstance(result, BaseException):
            self._finish(refusal(Path(path).name, result))
            return
        try:
            carried = settings_to_confirm(result["settings"], self.default_preset())
            keep = bool(carried) and self.ask(Path(path).name, carried)
        except Exception as exc:  # noqa: BLE001 - the import must end, or the window would wait on it for ever
            log.exception("asking about an imported conversation's settings")
            self._finish(refusal(Path(path).name, exc))
            return
        dropped = () if keep else tuple(carried)
        if job != self._job:  # the window closed while it asked
            return
        if self.store.path == MEMORY:  # no other connection can reach a store in memory: added here
            self._stored(job, self._add_here(result, dropped))
            return
        self._in_background(
            store_conversation, self.store.path, result, dropped, then=lambda outcome: self._stored(job, outcome)
        )

    def _add_here(self, data: dict, dropped: tuple) -> int | BaseException:
        try:
            return add_conversation(self.store, data, dropped)
        except sqlite3.Error as exc:
            return exc

    def _stored(self, job: int, outcome) -> None:
        path = self._under_way(job)
        if path is None:
            return
        name = Path(path).name
        self._finish(refusal(name, outcome) if isinstance(outcome, BaseException) else outcome)

    def _finish(self, result: int | str) -> None:
        self.path = None
        if self._loop is not None:
            self._loop.quit()
        self.finished.emit(result)
