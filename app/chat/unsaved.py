"""Answers the store refused (a full, read-only or vanished disk), held in memory until it takes them.

A write the store refuses never stops an answer: it goes on in the window, is held here (and shown from here), and
is saved again every RETRY_EVERY_S, at the next send and at close; still refused then, it is kept in a file of its
own that the next start saves (app/conversations/held_answers.py). One notice says so, and another once it is saved.
No widgets: the chat's controller (app/chat/session.py) and the tests drive it.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from app.conversations import held_answers
from app.conversations.store import ConversationStore, Message, is_busy

log = logging.getLogger(__name__)

RETRY_EVERY_S = 2.0  # an answer the store refused is saved again this often (and at the next send, and at close):
# a refused UPDATE costs next to nothing, and a close or a crash soon after space comes back must find it saved
STORE_ERRORS = (sqlite3.Error, OSError)  # what a full, read-only or vanished disk raises from the store


def store_problem(exc: BaseException) -> tuple[str, str]:
    """What kept the store from writing, and what to do about it, in words for a notice."""
    if is_busy(exc):
        return (
            f"the conversation file is busy ({exc}): an import is being stored, or another program holds it",
            "wait a moment",
        )
    full = (
        getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL"
        or getattr(exc, "errno", None) == errno.ENOSPC
        or "full" in str(exc)
    )
    if full:
        return f"the disk is full ({exc})", "free some space"
    return f"the conversation file cannot be written ({exc})", "check the disk and the conversation file"


def touch(store: ConversationStore, conversation_id: int) -> None:
    """Put the conversation first in the list, if the store takes it: only the list's order, touched again when an
    answer held is saved."""
    try:
        store.touch(conversation_id)
    except STORE_ERRORS:
        pass


class UnsavedAnswers(QObject):
    """The answers held: message id -> (conversation, message). streaming() is the answer being written, if any."""

    # text, level, key ("unsaved"): that answers are held, or that they are saved now
    notice = Signal(str, str, str)
    touched = Signal(int)  # an answer held in this conversation is saved now (the list shows it moved)

    def __init__(
        self, store: ConversationStore, streaming: Callable[[], Message | None], parent: QObject | None = None
    ):
        super().__init__(parent)
        self.store, self.streaming = store, streaming
        self._held: dict[int, tuple[int | None, Message]] = {}
        self._kept: tuple[str, Path] | None = None  # what keep() wrote last, and where
        self._retry_timer = QTimer(self, interval=int(RETRY_EVERY_S * 1000))
        self._retry_timer.timeout.connect(self.save)

    def __len__(self) -> int:
        return len(self._held)

    def messages(self) -> dict[int, Message]:
        """The answers held, by id, as they are in memory (ids are unique across conversations)."""
        return {mid: m for mid, (_, m) in self._held.items()}

    def hold(self, conversation_id: int | None, message: Message, exc: BaseException) -> None:
        """The store refused this message: keep it to save later, and say so once (not at every refusal). Only a
        message the store has added (it has an id) can be held: saving it later updates its row."""
        if message.id is None:
            raise ValueError("a message the store never added cannot be held: there is no row to save it into")
        if message.id in self._held:
            return
        self._held[message.id] = (conversation_id, message)
        self._retry_timer.start()
        what, remedy = store_problem(exc)
        log.warning("an answer could not be saved; it is held to be saved later: %s", exc)
        n = len(self._held)
        held = "This answer is" if n == 1 else f"{n} answers are"
        self.notice.emit(
            f"{held} not saved yet: {what}. It stays in the window and is saved when it can be "
            f"(every {RETRY_EVERY_S:g} s and when you send or close); {remedy}.",
            "error",
            "unsaved",
        )

    def save(self) -> bool:
        """Save the answers held, if the store takes them now: True once none is left."""
        if not self._held:
            return True
        for mid, (cid, message) in list(self._held.items()):
            try:
                self.store.update_message(message)
            except Exception as exc:  # noqa: BLE001 - held until it can be saved
                log.info("an answer held is still not saved: %s", exc)
                return False
            if cid is not None and message is not self.streaming():
                touch(self.store, cid)
                self.touched.emit(cid)
            self.saved(mid)
        return True

    def saved(self, message_id: int) -> None:
        """This message is saved: if it was held, it is no longer, and once none is, the user hears so."""
        if self._held.pop(message_id, None) is None or self._held:
            return
        self._retry_timer.stop()
        log.info("the answers held are saved now")
        self.notice.emit("Saved now: no answer is waiting to be saved any more.", "info", "unsaved")

    def forget(self, conversation_id: int) -> None:
        """The conversation was deleted: its answers held go with it."""
        for mid in [mid for mid, (cid, _) in self._held.items() if cid == conversation_id]:
            del self._held[mid]

    def keep(self) -> Path | None:
        """The answers still held, written where the next start saves them into the store (held_answers.py): where,
        or None if nowhere took them (or none is held). Written once: asked again with nothing changed, the file
        already written is the answer."""
        if not self._held:
            return None
        held = list(self._held.values())
        text = held_answers.answers_text(held)
        if self._kept is not None and self._kept[0] == text:
            return self._kept[1]
        place = held_answers.write_text(text, len(held))
        self._kept = (text, place) if place is not None else None
        return place

    def drop(self) -> None:
        """The store closes: nothing is retried or asked about any more."""
        self._retry_timer.stop()
        self._held.clear()
