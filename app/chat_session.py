"""One open conversation and the response being written: send, stop, regenerate, edit-and-resend.

Connects the ChatModel (what is shown), the store (what is saved) and the engine client. A
streaming response is saved at least every SAVE_EVERY_S, so a crash loses at most that much.
"""
from __future__ import annotations

import time
from typing import Callable

from PySide6.QtCore import QObject, Signal

from .chat_model import ChatModel, add_segments
from .presets import Preset, PresetBook
from .settings import AppSettings
from .store import ConversationStore, Message
from .worker import EngineClient, GenerationRequest

SAVE_EVERY_S = 0.5
TITLE_CHARS = 48


def storable(text: str) -> str:
    """Text as it can be saved and tokenized: a lone UTF-16 surrogate (pasted from a broken source)
    becomes U+FFFD instead of failing every UTF-8 encode downstream; proper pairs are kept."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[:TITLE_CHARS - 1].rstrip() + "…"


class ChatSession(QObject):
    busyChanged = Signal(bool)
    noticeRaised = Signal(str, str)  # text, level ("info" | "warning" | "error")
    conversationsChanged = Signal(int)  # a conversation was created, retitled or touched
    responseFinished = Signal(object)  # final stats dict
    responseFailed = Signal(str)

    def __init__(self, store: ConversationStore, engine: EngineClient, settings: Callable[[], AppSettings],
                 parent=None, presets: Callable[[], PresetBook] | None = None):
        super().__init__(parent)
        self.store = store
        self.engine = engine
        self.settings = settings
        self.presets = presets or (lambda: PresetBook.built_in(settings()))
        self.new_chat_settings: dict = {}  # the unsaved chat's preset and overrides, kept once it is sent
        self.model = ChatModel(self)
        self.conversation_id: int | None = None
        self.model_name = ""
        self.streaming: Message | None = None  # the response being written (maybe in another conversation)
        self.streaming_conversation: int | None = None
        self.request: GenerationRequest | None = None
        self._saved_at = 0.0
        w = engine.worker
        w.progress.connect(self._progress)
        w.finished.connect(self._finished)
        w.failed.connect(self._failed)

    @property
    def busy(self) -> bool:
        return self.request is not None

    # --- conversations ------------------------------------------------------------------------
    def open(self, conversation_id: int | None) -> None:
        self.conversation_id = conversation_id
        self.new_chat_settings = {}
        messages = self.store.messages(conversation_id) if conversation_id is not None else []
        if self.streaming is not None and conversation_id == self.streaming_conversation:
            # Show the live response object, not a saved copy of it, so it keeps streaming in view.
            messages = [self.streaming if m.id == self.streaming.id else m for m in messages]
        self.model.set_messages(messages)

    def new_conversation(self) -> None:
        """An empty chat; it is saved when its first message is sent."""
        self.open(None)

    def forget(self, conversation_id: int) -> None:
        """The conversation was deleted: stop writing into it and close it if open."""
        if self.streaming_conversation == conversation_id:
            self.stop()
            self.streaming = None  # nothing left to save it into
        if self.conversation_id == conversation_id:
            self.open(None)

    # --- actions ------------------------------------------------------------------------------
    def send(self, text: str) -> bool:
        text = storable(text).strip()
        if not text or self.busy:
            return False
        if self.conversation_id is None:
            self.conversation_id = self.store.create_conversation(title_from(text))
            self.store.set_conversation_settings(self.conversation_id,
                                                 {"preset": self.presets().default, **self.new_chat_settings})
        user = Message(id=None, role="user", content=text)
        self.store.add_message(self.conversation_id, user)
        self.model.append(user)
        self.conversationsChanged.emit(self.conversation_id)
        self._respond()
        return True

    def regenerate(self) -> bool:
        """Write the last response again."""
        items = self.model.items
        if self.busy or not items or items[-1].role != "assistant":
            return False
        self._remove_from(len(items) - 1)
        self._respond()
        return True

    def resend_edited(self, text: str) -> bool:
        """Replace the last user message (and the response to it) with text, and answer again."""
        items = self.model.items
        last_user = max((i for i, m in enumerate(items) if m.role == "user"), default=-1)
        if self.busy or last_user < 0 or not text.strip():
            return False
        self._remove_from(last_user)
        return self.send(text)

    def stop(self) -> None:
        if self.request is not None:
            self.request.cancel.set()

    def _remove_from(self, row: int) -> None:
        removed = self.model.remove_from(row)
        self.store.delete_messages([m.id for m in removed if m.id is not None])

    # --- this conversation's system prompt and sampling ----------------------------------------
    def conversation_settings(self) -> dict:
        """The open chat's preset name and the values it overrides ({} = the default preset as it is)."""
        if self.conversation_id is None:
            return dict(self.new_chat_settings)
        return self.store.conversation_settings(self.conversation_id)

    def set_conversation_settings(self, values: dict) -> None:
        if self.conversation_id is None:
            self.new_chat_settings = dict(values)
        else:
            self.store.set_conversation_settings(self.conversation_id, values)

    def chat_settings(self) -> Preset:
        """What the open chat's next response uses: its preset, with the chat's own values over it."""
        return self.presets().effective(self.conversation_settings())

    def _respond(self) -> None:
        settings = self.chat_settings()  # this chat's own: another chat's never leak in
        history = [{"role": m.role, "content": m.content} for m in self.model.items
                   if m.content and m.status != "error"]
        if settings.system_prompt.strip():
            history.insert(0, {"role": "system", "content": settings.system_prompt.strip()})
        reply = Message(id=None, role="assistant", status="streaming", model=self.model_name)
        self.store.add_message(self.conversation_id, reply)
        self.model.append(reply)
        self.streaming, self.streaming_conversation = reply, self.conversation_id
        self._saved_at = time.monotonic()
        self.request = self.engine.generate(GenerationRequest(messages=history, sampling=settings.sampling(),
                                                              max_tokens=settings.max_tokens))
        self.busyChanged.emit(True)

    # --- engine signals -----------------------------------------------------------------------
    def _mine(self, rid: int) -> bool:
        return self.request is not None and rid == self.request.id

    def _progress(self, rid: int, segments, stats) -> None:
        if not self._mine(rid) or self.streaming is None:
            return
        add_segments(self.streaming, segments)
        self.streaming.stats = stats
        self.streaming.model = self.streaming.model or self.model_name  # sent while the model was loading
        self._changed()
        if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self._save()

    def _finished(self, rid: int, stats) -> None:
        if not self._mine(rid):
            return
        if self.streaming is not None:
            self.streaming.stats = stats
            self.streaming.status = "stopped" if stats.get("finish_reason") == "cancelled" else "done"
            if not self.streaming.content and self.streaming.status == "done":
                self.streaming.notice = "The model ended its answer without writing anything."
        self._end()
        self.responseFinished.emit(stats)

    def _failed(self, rid: int, message: str, stats) -> None:
        if not self._mine(rid):
            return
        if self.streaming is not None:
            self.streaming.status = "error"
            self.streaming.notice = message
            self.streaming.stats = stats or self.streaming.stats
        self._end()
        self.noticeRaised.emit(message, "error")
        self.responseFailed.emit(message)

    def _end(self) -> None:
        self._changed()
        self._save()
        if self.streaming_conversation is not None and self.streaming is not None:
            self.store.touch(self.streaming_conversation)
            self.conversationsChanged.emit(self.streaming_conversation)
        self.streaming = self.streaming_conversation = self.request = None
        self.busyChanged.emit(False)

    def _changed(self) -> None:
        row = self.model.row_of(self.streaming) if self.streaming is not None else -1
        if row >= 0:
            self.model.changed(row)

    def _save(self) -> None:
        if self.streaming is not None and self.streaming.id is not None:
            self.store.update_message(self.streaming)
            self._saved_at = time.monotonic()

    def close(self) -> None:
        """The app is closing: whatever is still streaming is saved as stopped."""
        if self.streaming is not None:
            self.streaming.status = "stopped"
            self.streaming.notice = self.streaming.notice or "Stopped because the app was closed."
            self._save()
        self.streaming = self.streaming_conversation = self.request = None
