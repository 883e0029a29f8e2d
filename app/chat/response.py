"""The response being written: asked of the engine, streamed into its message (shown and saved as it grows), and
ended once, however it ends (finished, failed, stopped, or the app closing). No widgets: the chat's controller
(app/chat/session.py) starts it, and the tests drive both.

A streaming response is saved at least every SAVE_EVERY_S, so a crash loses at most that much; a save the store
refuses holds the answer (app/chat/unsaved.py) and the answer goes on. An answer that gets no new text for
STALL_AFTER_S says so under it, with the seconds counting, until text comes again. Stop always ends the answer in
the window: the engine stops within a step, and if it has not said so within STOP_GRACE_S (a stuck engine), the
answer is ended here, kept as far as it got.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.answers import GenerationRequest
from app.chat.model import ChatModel, add_segments
from app.chat.unsaved import UnsavedAnswers, touch
from app.conversations.store import ConversationStore, Message
from app.remote_answer import model_label
from app.worker import EngineClient
from engine.reasoning import ThoughtClock

SAVE_EVERY_S = 0.5
STALL_AFTER_S = 20.0  # a long prompt on a slow CPU may take this long to read; beyond it, say so
STOP_GRACE_S = 3.0  # the engine honours Stop within a step (or a template's 3 s limit); past this it is stuck


class Response(QObject):
    """The answer being written (maybe in a conversation other than the one shown): its message, the conversation it
    belongs to, and the engine request writing it; all None between answers."""

    busyChanged = Signal(bool)
    finished = Signal(object)  # final stats dict
    failed = Signal(str)
    noticeRaised = Signal(str, str)  # text, level
    conversationChanged = Signal(int)  # the conversation the answer ended in (the list shows it moved)

    def __init__(
        self,
        engine: EngineClient,
        store: ConversationStore,
        model: ChatModel,
        unsaved: UnsavedAnswers,
        model_name: Callable[[], str],
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.engine, self.store, self.model, self.unsaved, self.model_name = engine, store, model, unsaved, model_name
        self.message: Message | None = None
        self.conversation_id: int | None = None
        self.request: GenerationRequest | None = None
        self._before_continue: tuple | None = None  # (status, stats) of an answer being continued
        self._saved_at = 0.0
        self._thought = ThoughtClock()  # times the response's <think> block
        self._progress_at = 0.0  # when the answer last got text (or started)
        self._stall_notice = ""  # what the stall watch wrote under the answer, until text comes again
        self._stall_timer = QTimer(self, interval=1000)
        self._stall_timer.timeout.connect(self._watch_stall)
        engine.progress.connect(self._progress)
        engine.finished.connect(self._finished)
        engine.failed.connect(self._failed)

    @property
    def busy(self) -> bool:
        return self.request is not None

    def start(self, message: Message, conversation_id: int | None, request: GenerationRequest) -> None:
        """Write message (saved already, shown already) with the engine's answer to request."""
        self.message, self.conversation_id = message, conversation_id
        self._thought = ThoughtClock((message.stats or {}).get("thought_s"))
        self._saved_at = time.monotonic()
        self.request = self.engine.generate(request)
        self._progress_at, self._stall_notice = time.monotonic(), ""
        self._stall_timer.start()
        self.busyChanged.emit(True)

    def resume(self, message: Message, conversation_id: int | None, request: GenerationRequest) -> None:
        """Write more of message, an answer cut short, with the engine's answer to request (continue_last)."""
        self._before_continue = (message.status, message.stats)  # put back if the continuation fails
        message.status, message.notice = "streaming", ""
        self.message, self.conversation_id = message, conversation_id
        self.save()  # refused (a full disk): it continues in memory, held like any answer
        self.changed()
        self.start(message, conversation_id, request)

    def stop(self) -> None:
        if self.request is not None:
            self.request.cancel.set()
            rid = self.request.id
            QTimer.singleShot(int(STOP_GRACE_S * 1000), lambda: self._stop_unanswered(rid))

    def abandon(self) -> None:
        """Its conversation was deleted: stop, with nothing left to save the answer into."""
        self.stop()
        self.message = None

    def close(self) -> None:
        """The app is closing: what is still streaming is saved as stopped."""
        self._stall_timer.stop()
        if self.message is not None:
            self.message.status = "stopped"
            self.message.notice = self.message.notice or "Stopped because the app was closed."
            self.save()
        self.message = self.conversation_id = self.request = None

    def _stop_unanswered(self, rid: int) -> None:
        """Stop was asked STOP_GRACE_S ago and the engine has not ended this answer: end it here. The engine's
        late signals for it are then ignored (they are not this answer's request any more)."""
        if not self._mine(rid):
            return
        stats = dict(self.message.stats or {}) if self.message is not None else {}
        if self.message is not None:
            self.message.status = "stopped"
            self.message.notice = (
                f"Stopped. The engine did not stop within {STOP_GRACE_S:g} s; it finishes what "
                "it was doing in the background, and the next message waits for it."
            )
        self._end()
        self.finished.emit({**stats, "finish_reason": "cancelled"})

    def _watch_stall(self) -> None:
        """Once a second while an answer streams: after STALL_AFTER_S without new text, say so under it."""
        if self.message is None or self.request is None:
            return
        waited = time.monotonic() - self._progress_at
        if waited < STALL_AFTER_S:
            return
        if self.message.content:
            said = f"No new text for {waited:.0f} s. The model may still be working on it; Stop ends it."
        else:
            said = f"No text yet after {waited:.0f} s. The model is still reading the prompt, or stuck; Stop ends it."
        self.message.notice = self._stall_notice = said
        self.changed()

    # --- engine signals -----------------------------------------------------------------------
    def _mine(self, rid: int) -> bool:
        return self.request is not None and rid == self.request.id

    def _progress(self, rid: int, segments, stats) -> None:
        if not self._mine(rid) or self.message is None or self.request is None:  # (mine: request is not None)
            return
        add_segments(self.message, segments)
        self._progress_at = time.monotonic()
        if self._stall_notice and self.message.notice == self._stall_notice:  # text again: the notice goes
            self.message.notice = ""
        self._stall_notice = ""
        self.message.stats = self._with_thought(self.message, stats)
        self.message.model = self.message.model or self.model_name()  # sent while the model was loading
        if stats.get("model") and self.request.remote is not None:  # the model the server says answered
            self.message.model = f"{model_label(stats['model'])} @ {self.request.remote.host}"
        self.changed()
        if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save()

    def _finished(self, rid: int, stats) -> None:
        if not self._mine(rid):
            return
        if self.message is not None:
            self.message.stats = self._with_thought(self.message, stats)
            self.message.status = "stopped" if stats.get("finish_reason") == "cancelled" else "done"
            if not self.message.content and self.message.status == "done":
                self.message.notice = "The model ended its answer without writing anything."
        self._end()
        self.finished.emit(stats)

    def _failed(self, rid: int, message: str, stats) -> None:
        if not self._mine(rid):
            return
        if self.message is not None and self._before_continue is not None:
            # A failed continuation leaves the answer as it was (it can be continued again), with the reason.
            self.message.status, self.message.stats = self._before_continue
            self.message.notice = message
        elif self.message is not None:
            self.message.status = "error"
            self.message.notice = message
            self.message.stats = self._with_thought(self.message, stats) if stats else self.message.stats
        self._end()
        self.noticeRaised.emit(message, "error")
        self.failed.emit(message)

    def _with_thought(self, message: Message, stats: dict) -> dict:
        """stats with the measured length of the response's thought (in message, the answer), kept with them (so it
        is saved)."""
        seconds = self._thought.update(message.content, time.monotonic())
        return stats if seconds is None else {**stats, "thought_s": seconds}

    def _end(self) -> None:
        self._stall_timer.stop()
        if self._stall_notice and self.message is not None and self.message.notice == self._stall_notice:
            self.message.notice = ""  # the answer ended: it no longer waits
        self._stall_notice = ""
        self._before_continue = None
        try:
            self.changed()
            self.save()
            if self.conversation_id is not None and self.message is not None:
                touch(self.store, self.conversation_id)
                self.conversationChanged.emit(self.conversation_id)
        finally:  # whatever went wrong above, the window is ready for the next message
            self.message = self.conversation_id = self.request = None
            self.busyChanged.emit(False)

    # --- shown and saved ----------------------------------------------------------------------
    def changed(self) -> None:
        """The answer's row shows it as it is now (if its conversation is the one shown)."""
        row = self.model.row_of(self.message) if self.message is not None else -1
        if row >= 0:
            self.model.changed(row)

    def save(self) -> None:
        if self.message is not None and self.message.id is not None:
            self._saved_at = time.monotonic()
            try:
                self.store.update_message(self.message)
            except Exception as exc:  # noqa: BLE001 - whatever the store raised, the answer is held, not lost
                self.unsaved.hold(self.conversation_id, self.message, exc)
            else:
                self.unsaved.saved(self.message.id)
