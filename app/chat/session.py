"""One open conversation and the response being written: send, stop, regenerate, edit-and-resend,
continue, and switching between the branches that regenerating and editing leave.

Connects the ChatModel (what is shown), the store (what is saved) and the engine client. A
streaming response is saved at least every SAVE_EVERY_S, so a crash loses at most that much.

An answer that gets no new text for STALL_AFTER_S says so under it, with the seconds counting, until text
comes again. Stop always ends the answer in the window: the engine stops within a step, and if it has not
said so within STOP_GRACE_S (a stuck engine), the answer is ended here, kept as far as it got.

A write the store refuses (a full disk) never stops an answer: it keeps streaming into the window, ends as
usual, and is held in memory (shown from there) and saved again every RETRY_EVERY_S, at the next send and at
close (still refused then, it is kept in a file of its own that the next start saves: held_answers.py); one
notice says so (saveNotice), and another once it is saved. A question that cannot be saved is not sent.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from app.answers import GenerationRequest
from app.chat.model import ChatModel, add_segments, continuable
from app.conversations import held_answers
from app.conversations.store import ConversationStore, Message, MessageTree, is_busy
from app.remote_answer import model_label
from app.settings.presets import Preset, PresetBook
from app.settings.values import AppSettings
from app.worker import EngineClient
from engine.reasoning import ThoughtClock, without_thinking
from engine.remote.endpoint import Endpoint
from engine.text_rules import plain_name, valid_text

log = logging.getLogger(__name__)

SAVE_EVERY_S = 0.5
RETRY_EVERY_S = 2.0  # an answer the store refused is saved again this often (and at the next send, and at close):
# a refused UPDATE costs next to nothing, and a close or a crash soon after space comes back must find it saved
STORE_ERRORS = (sqlite3.Error, OSError)  # what a full, read-only or vanished disk raises from the store
TITLE_CHARS = 48
STALL_AFTER_S = 20.0  # a long prompt on a slow CPU may take this long to read; beyond it, say so
STOP_GRACE_S = 3.0  # the engine honours Stop within a step (or a template's 3 s limit); past this it is stuck


storable = valid_text  # text as it can be saved and tokenized (engine.text_rules)


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


def title_from(text: str) -> str:
    line = plain_name(text)
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


class ChatSession(QObject):
    busyChanged = Signal(bool)
    noticeRaised = Signal(str, str)  # text, level ("info" | "warning" | "error")
    conversationsChanged = Signal(int)  # a conversation was created, retitled or touched
    responseFinished = Signal(object)  # final stats dict
    responseFailed = Signal(str)
    # text, level, key: what the store refused ("unsaved": an answer, "unsent": a question), each replacing the
    # last with its key; no text: nothing to say any more
    saveNotice = Signal(str, str, str)

    def __init__(
        self,
        store: ConversationStore,
        engine: EngineClient,
        settings: Callable[[], AppSettings],
        parent=None,
        presets: Callable[[], PresetBook] | None = None,
    ):
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
        self._unsaved: dict[int, tuple[int | None, Message]] = {}  # id -> (conversation, message) not saved yet
        self._retry_timer = QTimer(self, interval=int(RETRY_EVERY_S * 1000))
        self._retry_timer.timeout.connect(self.save_unsaved)
        engine.progress.connect(self._progress)
        engine.finished.connect(self._finished)
        engine.failed.connect(self._failed)

    @property
    def busy(self) -> bool:
        return self.request is not None

    # --- conversations ------------------------------------------------------------------------
    def open(self, conversation_id: int | None) -> None:
        self.conversation_id = conversation_id
        self.new_chat_settings = {}
        self.model.set_messages(*self._path())

    def _path(self, tree: MessageTree | None = None) -> tuple[list[Message], list[list[int]]]:
        """The open conversation's branch shown, and each message's siblings (see ChatModel), from its tree
        (read here unless given)."""
        if self.conversation_id is None:
            return [], []
        tree = tree if tree is not None else self.store.tree(self.conversation_id)
        messages = tree.path()
        # Show the live response object, not a saved copy of it, so it keeps streaming in view; and an answer
        # not saved yet as it is in memory (ids are unique across conversations).
        live = {mid: m for mid, (_, m) in self._unsaved.items()}
        if self.streaming is not None:
            live[self.streaming.id] = self.streaming
        messages = [live.get(m.id, m) for m in messages]
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
        for mid in [mid for mid, (cid, _) in self._unsaved.items() if cid == conversation_id]:
            del self._unsaved[mid]
        if self.conversation_id == conversation_id:
            self.open(None)

    # --- actions ------------------------------------------------------------------------------
    def send(self, text: str) -> bool:
        text = storable(text).strip()
        if not text or self.busy:
            return False
        new = self.conversation_id is None
        parent = self.model.items[-1].id if self.model.items else None

        def write(settings: Preset) -> Message:
            if new:
                self.conversation_id = self.store.create_conversation(title_from(text))
                self.store.set_conversation_settings(
                    self.conversation_id, {"preset": self.presets().default, **self.new_chat_settings}
                )
            return self._add_turn(text, parent, settings)

        turn = self._written(write)
        if turn is None and new:
            self.conversation_id = None  # its creation was undone with the rest
        return turn is not None and self._start(*turn)

    def _add_turn(self, text: str, parent: int | None, settings: Preset) -> Message:
        """Save the question and the row its answer streams into (inside a _written transaction)."""
        user = Message(id=None, role="user", content=text)
        self.store.add_message(self.conversation_id, user, parent=parent)
        return self._add_reply(user.id, settings)

    def _add_reply(self, parent: int, settings: Preset) -> Message:
        reply = Message(id=None, role="assistant", status="streaming", model=self.answering_model(settings))
        self.store.add_message(self.conversation_id, reply, parent=parent)
        return reply

    def _written(self, write: Callable[[Preset], Message]) -> tuple[Message, MessageTree, Preset] | None:
        """One trip to the store for an answer about to start, as one transaction: the chat's settings read (once:
        they go along with the answer), write(settings) saving its rows, and the tree read back to show them. None
        (nothing written, the user told) if the store refused it. Answers held from before are tried first: a
        send is a moment to save them."""
        self.save_unsaved()
        try:
            with self.store.transaction():
                settings = self.chat_settings()  # a chat created by write() has new_chat_settings: the same
                reply = write(settings)
                written = reply, self.store.tree(self.conversation_id), settings
        except STORE_ERRORS as exc:
            what, remedy = store_problem(exc)
            log.warning("a message could not be saved, so it was not sent: %s", exc)
            self.saveNotice.emit(
                f"Not sent: {what}. Your message stays in the box; {remedy} and send it again.", "error", "unsent"
            )
            return None
        self.saveNotice.emit("", "", "unsent")  # sent: a refusal told before is over
        return written

    def regenerate(self, message: Message | None = None) -> bool:
        """Write this response (by default the last) again, as a new branch beside it: it stays."""
        items = self.model.items
        message = message if message is not None else (items[-1] if items else None)
        if (
            self.busy
            or message is None
            or message.role != "assistant"
            or message.parent_id is None
            or self.model.row_of(message) < 0
        ):
            return False
        turn = self._written(lambda settings: self._add_reply(message.parent_id, settings))
        return turn is not None and self._start(*turn)

    def resend_edited(self, text: str, message: Message | None = None) -> bool:
        """Send text in place of this user message (by default the last) and answer it: a new branch from
        there, beside the old one, which stays."""
        text = storable(text).strip()
        if message is None:
            message = next((m for m in reversed(self.model.items) if m.role == "user"), None)
        if self.busy or message is None or message.role != "user" or not text or self.model.row_of(message) < 0:
            return False

        def write(settings: Preset) -> Message:
            if message.parent_id is None:
                self._retitle(message.content, text, notify=False)  # _start says the conversation changed
            return self._add_turn(text, message.parent_id, settings)

        turn = self._written(write)
        return turn is not None and self._start(*turn)

    def _retitle(self, old: str, new: str, notify: bool = True) -> None:
        """The first question shown changed from old to new: a title made from old follows it; one the user
        chose stays."""
        conv = self.store.conversation(self.conversation_id)
        if conv is not None and conv.title == title_from(old) != title_from(new):
            self.store.rename(self.conversation_id, title_from(new))
            if notify:
                self.conversationsChanged.emit(self.conversation_id)  # the sidebar shows the new title

    def continue_answer(self, message: Message | None = None) -> bool:
        """Write more of the last answer, cut short by the length limit or a stop, into the same message."""
        items = self.model.items
        message = message if message is not None else (items[-1] if items else None)
        if self.busy or not items or message is not items[-1] or not continuable(message):
            return False
        self._before_continue = (message.status, message.stats)  # put back if the continuation fails
        message.status, message.notice = "streaming", ""
        self.streaming, self.streaming_conversation = message, self.conversation_id
        self._save()  # refused (a full disk): it continues in memory, held like any answer
        self._changed()
        self._generate(items, self.chat_settings(), continue_last=True)
        return True

    def switch_branch(self, message: Message, step: int) -> bool:
        """Show the sibling `step` places after (negative: before) this message, and the branch below it."""
        row = self.model.row_of(message)
        sibling = self.model.sibling_id(row, step) if row >= 0 else None
        if sibling is None:
            return False
        try:
            self.store.set_active(sibling)
        except STORE_ERRORS as exc:  # the branch shown is the one the file says: it stays as it was
            what, remedy = store_problem(exc)
            self.noticeRaised.emit(f"The other answer is not shown: {what}; {remedy} and try again.", "error")
            return False
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
            self.streaming.notice = (
                f"Stopped. The engine did not stop within {STOP_GRACE_S:g} s; it finishes what "
                "it was doing in the background, and the next message waits for it."
            )
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
            try:
                self.store.set_conversation_settings(self.conversation_id, values)
            except STORE_ERRORS as exc:
                what, remedy = store_problem(exc)
                self.noticeRaised.emit(
                    f"The chat's settings were not saved: {what}; {remedy} and set them again.", "error"
                )

    def chat_settings(self) -> Preset:
        """What the open chat's next response uses: its preset, with the chat's own values over it."""
        return self.presets().effective(self.conversation_settings())

    def remote_endpoint(self, settings: Preset | None = None) -> Endpoint | None:
        """The open chat's remote engine (its key left to app/remote_answer.py), or None for this machine's; from
        its settings (read here unless given)."""
        settings = settings if settings is not None else self.chat_settings()
        return Endpoint(settings.engine_url, settings.engine_model) if settings.remote else None

    def answering_model(self, settings: Preset | None = None) -> str:
        """Who answers the open chat: this machine's model, or a remote server's (its model once one answered)."""
        remote = self.remote_endpoint(settings)
        if remote is None:
            return self.model_name
        return f"{remote.model} @ {remote.host}" if remote.model else remote.host

    def _start(self, reply: Message, tree: MessageTree, settings: Preset) -> bool:
        """Write the answer saved as `reply`'s row, shown from here on (tree: the conversation as just written)."""
        self.streaming, self.streaming_conversation = reply, self.conversation_id
        self.model.show_path(*self._path(tree))
        self.conversationsChanged.emit(self.conversation_id)
        self._generate(self.model.items[:-1], settings)
        return True

    def prompt_history(
        self, messages: list[Message], continue_last: bool = False, settings: Preset | None = None
    ) -> list[dict]:
        """What the model is sent for these messages: the chat's system prompt (from its settings, read here unless
        given), then each message; an earlier answer goes without its thought (<think>…</think>), as reasoning
        models' own templates send it."""
        settings = settings if settings is not None else self.chat_settings()
        history = []
        for i, m in enumerate(messages):
            whole = m.role != "assistant" or (continue_last and i == len(messages) - 1)
            content = storable(m.content if whole else without_thinking(m.content))  # (imported text too)
            if content and m.status != "error":
                history.append({"role": m.role, "content": content})
        if settings.system_prompt.strip():
            history.insert(0, {"role": "system", "content": storable(settings.system_prompt.strip())})
        return history

    def _generate(self, messages: list[Message], settings: Preset, continue_last: bool = False) -> None:
        """Ask the engine for the answer to messages, with this chat's own settings (another chat's never leak in)."""
        history = self.prompt_history(messages, continue_last, settings)
        self._thought = ThoughtClock((self.streaming.stats or {}).get("thought_s") if self.streaming else None)
        self._saved_at = time.monotonic()
        remote = self.remote_endpoint(settings)
        self.request = self.engine.generate(
            GenerationRequest(
                messages=history,
                sampling=settings.sampling(),
                max_tokens=settings.max_tokens,
                continue_last=continue_last,
                remote=remote,
            )
        )
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
        try:
            self._changed()
            self._save()
            if self.streaming_conversation is not None and self.streaming is not None:
                self._touch(self.streaming_conversation)
                self.conversationsChanged.emit(self.streaming_conversation)
        finally:  # whatever went wrong above, the window is ready for the next message
            self.streaming = self.streaming_conversation = self.request = None
            self.busyChanged.emit(False)

    def _changed(self) -> None:
        row = self.model.row_of(self.streaming) if self.streaming is not None else -1
        if row >= 0:
            self.model.changed(row)

    def _save(self) -> None:
        if self.streaming is not None and self.streaming.id is not None:
            self._saved_at = time.monotonic()
            try:
                self.store.update_message(self.streaming)
            except Exception as exc:  # noqa: BLE001 - whatever the store raised, the answer is held, not lost
                self._hold(self.streaming_conversation, self.streaming, exc)
            else:
                self._saved(self.streaming.id)

    def _touch(self, conversation_id: int) -> None:
        try:
            self.store.touch(conversation_id)
        except STORE_ERRORS:
            pass  # only the list's order: touched again when the answer held is saved

    def _hold(self, conversation_id: int | None, message: Message, exc: BaseException) -> None:
        """The store refused this message: keep it to save later, and say so once (not at every refusal)."""
        if message.id in self._unsaved:
            return
        self._unsaved[message.id] = (conversation_id, message)
        self._retry_timer.start()
        what, remedy = store_problem(exc)
        log.warning("an answer could not be saved; it is held to be saved later: %s", exc)
        n = len(self._unsaved)
        held = "This answer is" if n == 1 else f"{n} answers are"
        self.saveNotice.emit(
            f"{held} not saved yet: {what}. It stays in the window and is saved when it can be "
            f"(every {RETRY_EVERY_S:g} s and when you send or close); {remedy}.",
            "error",
            "unsaved",
        )

    @property
    def unsaved(self) -> int:
        """How many answers are held in memory because the store refused them."""
        return len(self._unsaved)

    def save_unsaved(self) -> bool:
        """Save the answers the store refused, if it takes them now: True once none is left."""
        if not self._unsaved:
            return True
        for mid, (cid, message) in list(self._unsaved.items()):
            try:
                self.store.update_message(message)
            except Exception as exc:  # noqa: BLE001 - held until it can be saved (see _save)
                log.info("an answer held is still not saved: %s", exc)
                return False
            if cid is not None and message is not self.streaming:
                self._touch(cid)
                self.conversationsChanged.emit(cid)
            self._saved(mid)
        return True

    def _saved(self, message_id: int) -> None:
        """This message is saved: if it was held, it is no longer, and once none is, the user hears so."""
        if self._unsaved.pop(message_id, None) is None or self._unsaved:
            return
        self._retry_timer.stop()
        log.info("the answers held are saved now")
        self.saveNotice.emit("Saved now: no answer is waiting to be saved any more.", "info", "unsaved")

    def close(self) -> bool:
        """The app is closing: whatever is still streaming is saved as stopped, and answers held are tried once
        more, or else kept for the next start (keep_held). False if something could be neither (it is dropped: the
        caller tells the user)."""
        self._stall_timer.stop()
        if self.streaming is not None:
            self.streaming.status = "stopped"
            self.streaming.notice = self.streaming.notice or "Stopped because the app was closed."
            self._save()
        self.streaming = self.streaming_conversation = self.request = None
        saved = self.save_unsaved() or self.keep_held() is not None
        self._retry_timer.stop()
        self._unsaved.clear()  # the store closes next: a later close has nothing to ask about
        return saved

    def keep_held(self) -> Path | None:
        """The answers the store still refuses, written where the next start saves them into the store
        (held_answers.py): where, or None if nowhere took them."""
        return held_answers.write(list(self._unsaved.values())) if self._unsaved else None
