"""One open conversation and the response being written: send, stop, regenerate, edit-and-resend,
continue, and switching between the branches that regenerating and editing leave.

Connects the ChatModel (what is shown), the store (what is saved) and the engine client. A
streaming response is saved at least every SAVE_EVERY_S, so a crash loses at most that much.

An answer that gets no new text for STALL_AFTER_S says so under it, with the seconds counting, until text
comes again. Stop always ends the answer in the window: the engine stops within a step, and if it has not
said so within STOP_GRACE_S (a stuck engine), the answer is ended here, kept as far as it got.
"""
from __future__ import annotations

import time
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from engine.reasoning import ThoughtClock, without_thinking
from engine.remote.endpoint import Endpoint

from app.chat.model import ChatModel, add_segments, continuable
from app.remote_answer import model_label
from app.settings.presets import Preset, PresetBook
from app.settings.values import AppSettings
from app.conversations.store import ConversationStore, Message
from app.worker import EngineClient, GenerationRequest

SAVE_EVERY_S = 0.5
TITLE_CHARS = 48
STALL_AFTER_S = 20.0  # a long prompt on a slow CPU may take this long to read; beyond it, say so
STOP_GRACE_S = 3.0  # the engine honours Stop within a step (or a template's 3 s limit); past this it is stuck


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
        self._before_continue: tuple | None = None  # (status, stats) of an answer being continued
        self.streaming_conversation: int | None = None
        self.request: GenerationRequest | None = None
        self._saved_at = 0.0
        self._thought = ThoughtClock()  # times the streaming response's <think> block
        self._progress_at = 0.0  # when the streaming answer last got text (or started)
        self._stall_notice = ""  # what the stall watch wrote under the answer, until text comes again
        self._stall_timer = QTimer(self, interval=1000)
        self._stall_timer.timeout.connect(self._watch_stall)
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
        self.model.set_messages(*self._path())

    def _path(self) -> tuple[list[Message], list[list[int]]]:
        """The open conversation's branch shown, and each message's siblings (see ChatModel)."""
        if self.conversation_id is None:
            return [], []
        tree = self.store.tree(self.conversation_id)
        messages = tree.path()
        if self.streaming is not None and self.conversation_id == self.streaming_conversation:
            # Show the live response object, not a saved copy of it, so it keeps streaming in view.
            messages = [self.streaming if m.id == self.streaming.id else m for m in messages]
        return messages, [tree.siblings(m) for m in messages]

    def _show_path(self) -> None:
        self.model.show_path(*self._path())

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
        self._ask(text, self.model.items[-1].id if self.model.items else None)
        return True

    def _ask(self, text: str, parent: int | None) -> None:
        user = Message(id=None, role="user", content=text)
        self.store.add_message(self.conversation_id, user, parent=parent)
        self._show_path()
        self.conversationsChanged.emit(self.conversation_id)
        self._respond(user.id)

    def regenerate(self, message: Message | None = None) -> bool:
        """Write this response (by default the last) again, as a new branch beside it: it stays."""
        items = self.model.items
        message = message if message is not None else (items[-1] if items else None)
        if (self.busy or message is None or message.role != "assistant" or message.parent_id is None
                or self.model.row_of(message) < 0):
            return False
        self._respond(message.parent_id)
        return True

    def resend_edited(self, text: str, message: Message | None = None) -> bool:
        """Send text in place of this user message (by default the last) and answer it: a new branch from
        there, beside the old one, which stays."""
        text = storable(text).strip()
        if message is None:
            message = next((m for m in reversed(self.model.items) if m.role == "user"), None)
        if self.busy or message is None or message.role != "user" or not text or self.model.row_of(message) < 0:
            return False
        if message.parent_id is None:
            self._retitle(message.content, text)
        self._ask(text, message.parent_id)
        return True

    def _retitle(self, old: str, new: str) -> None:
        """The first question shown changed from old to new: a title made from old follows it; one the user
        chose stays."""
        conv = self.store.conversation(self.conversation_id)
        if conv is not None and conv.title == title_from(old) != title_from(new):
            self.store.rename(self.conversation_id, title_from(new))
            self.conversationsChanged.emit(self.conversation_id)  # the sidebar shows the new title

    def continue_answer(self, message: Message | None = None) -> bool:
        """Write more of the last answer, cut short by the length limit or a stop, into the same message."""
        items = self.model.items
        message = message if message is not None else (items[-1] if items else None)
        if self.busy or not items or message is not items[-1] or not continuable(message):
            return False
        self._before_continue = (message.status, message.stats)  # put back if the continuation fails
        message.status, message.notice = "streaming", ""
        self.store.update_message(message)
        self.streaming, self.streaming_conversation = message, self.conversation_id
        self._changed()
        self._generate(items, continue_last=True)
        return True

    def switch_branch(self, message: Message, step: int) -> bool:
        """Show the sibling `step` places after (negative: before) this message, and the branch below it."""
        row = self.model.row_of(message)
        sibling = self.model.sibling(row, step) if row >= 0 else None
        if sibling is None:
            return False
        self.store.set_active(sibling)
        self._show_path()
        if message.parent_id is None and message.role == "user" and self.model.items:
            self._retitle(message.content, self.model.items[0].content)  # the title follows the question shown
        return True

    def stop(self) -> None:
        if self.request is not None:
            self.request.cancel.set()
            rid = self.request.id
            QTimer.singleShot(int(STOP_GRACE_S * 1000), lambda: self._stop_unanswered(rid))

    def _stop_unanswered(self, rid: int) -> None:
        """Stop was asked STOP_GRACE_S ago and the engine has not ended this answer: end it here. The engine's
        late signals for it are then ignored (they are not this session's request any more)."""
        if not self._mine(rid):
            return
        stats = dict(self.streaming.stats or {}) if self.streaming is not None else {}
        if self.streaming is not None:
            self.streaming.status = "stopped"
            self.streaming.notice = (f"Stopped. The engine did not stop within {STOP_GRACE_S:g} s; it finishes what "
                                     "it was doing in the background, and the next message waits for it.")
        self._end()
        self.responseFinished.emit({**stats, "finish_reason": "cancelled"})

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

    def remote_endpoint(self) -> Endpoint | None:
        """The open chat's remote engine (its key left to app/remote_answer.py), or None for this machine's."""
        settings = self.chat_settings()
        return Endpoint(settings.engine_url, settings.engine_model) if settings.remote else None

    def answering_model(self) -> str:
        """Who answers the open chat: this machine's model, or a remote server's (its model once one answered)."""
        remote = self.remote_endpoint()
        if remote is None:
            return self.model_name
        return f"{remote.model} @ {remote.host}" if remote.model else remote.host

    def _respond(self, parent: int) -> None:
        """A new answer to the message `parent`, shown and written."""
        reply = Message(id=None, role="assistant", status="streaming", model=self.answering_model())
        self.store.add_message(self.conversation_id, reply, parent=parent)
        self.streaming, self.streaming_conversation = reply, self.conversation_id
        self._show_path()
        self._generate(self.model.items[:-1])

    def prompt_history(self, messages: list[Message], continue_last: bool = False) -> list[dict]:
        """What the model is sent for these messages: the chat's system prompt, then each message; an earlier
        answer goes without its thought (<think>…</think>), as reasoning models' own templates send it."""
        settings = self.chat_settings()
        history = []
        for i, m in enumerate(messages):
            whole = m.role != "assistant" or (continue_last and i == len(messages) - 1)
            content = storable(m.content if whole else without_thinking(m.content))  # (imported text too)
            if content and m.status != "error":
                history.append({"role": m.role, "content": content})
        if settings.system_prompt.strip():
            history.insert(0, {"role": "system", "content": storable(settings.system_prompt.strip())})
        return history

    def _generate(self, messages: list[Message], continue_last: bool = False) -> None:
        settings = self.chat_settings()  # this chat's own: another chat's never leak in
        history = self.prompt_history(messages, continue_last)
        self._thought = ThoughtClock((self.streaming.stats or {}).get("thought_s") if self.streaming else None)
        self._saved_at = time.monotonic()
        remote = self.remote_endpoint()
        self.request = self.engine.generate(GenerationRequest(messages=history, sampling=settings.sampling(),
                                                              max_tokens=settings.max_tokens,
                                                              continue_last=continue_last, remote=remote))
        self._progress_at, self._stall_notice = time.monotonic(), ""
        self._stall_timer.start()
        self.busyChanged.emit(True)

    def _watch_stall(self) -> None:
        """Once a second while an answer streams: after STALL_AFTER_S without new text, say so under it."""
        if self.streaming is None or self.request is None:
            return
        waited = time.monotonic() - self._progress_at
        if waited < STALL_AFTER_S:
            return
        if self.streaming.content:
            said = f"No new text for {waited:.0f} s. The model may still be working on it; Stop ends it."
        else:
            said = f"No text yet after {waited:.0f} s. The model is still reading the prompt, or stuck; Stop ends it."
        self.streaming.notice = self._stall_notice = said
        self._changed()

    # --- engine signals -----------------------------------------------------------------------
    def _mine(self, rid: int) -> bool:
        return self.request is not None and rid == self.request.id

    def _progress(self, rid: int, segments, stats) -> None:
        if not self._mine(rid) or self.streaming is None:
            return
        add_segments(self.streaming, segments)
        self._progress_at = time.monotonic()
        if self._stall_notice and self.streaming.notice == self._stall_notice:  # text again: the notice goes
            self.streaming.notice = ""
        self._stall_notice = ""
        self.streaming.stats = self._with_thought(stats)
        self.streaming.model = self.streaming.model or self.model_name  # sent while the model was loading
        if stats.get("model") and self.request.remote is not None:  # the model the server says answered
            self.streaming.model = f"{model_label(stats['model'])} @ {self.request.remote.host}"
        self._changed()
        if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self._save()

    def _finished(self, rid: int, stats) -> None:
        if not self._mine(rid):
            return
        if self.streaming is not None:
            self.streaming.stats = self._with_thought(stats)
            self.streaming.status = "stopped" if stats.get("finish_reason") == "cancelled" else "done"
            if not self.streaming.content and self.streaming.status == "done":
                self.streaming.notice = "The model ended its answer without writing anything."
        self._end()
        self.responseFinished.emit(stats)

    def _failed(self, rid: int, message: str, stats) -> None:
        if not self._mine(rid):
            return
        if self.streaming is not None and self._before_continue is not None:
            # A failed continuation leaves the answer as it was (it can be continued again), with the reason.
            self.streaming.status, self.streaming.stats = self._before_continue
            self.streaming.notice = message
        elif self.streaming is not None:
            self.streaming.status = "error"
            self.streaming.notice = message
            self.streaming.stats = self._with_thought(stats) if stats else self.streaming.stats
        self._end()
        self.noticeRaised.emit(message, "error")
        self.responseFailed.emit(message)

    def _with_thought(self, stats: dict) -> dict:
        """stats with the measured length of the response's thought, kept with them (so it is saved)."""
        seconds = self._thought.update(self.streaming.content, time.monotonic())
        return stats if seconds is None else {**stats, "thought_s": seconds}

    def _end(self) -> None:
        self._stall_timer.stop()
        if self._stall_notice and self.streaming is not None and self.streaming.notice == self._stall_notice:
            self.streaming.notice = ""  # the answer ended: it no longer waits
        self._stall_notice = ""
        self._before_continue = None
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
        self._stall_timer.stop()
        if self.streaming is not None:
            self.streaming.status = "stopped"
            self.streaming.notice = self.streaming.notice or "Stopped because the app was closed."
            self._save()
        self.streaming = self.streaming_conversation = self.request = None
