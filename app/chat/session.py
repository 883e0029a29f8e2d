"""The chat's controller: one open conversation and what is done with it: send, stop, regenerate, edit-and-resend,
continue, switching between the branches that regenerating and editing leave, and the chat's own settings.

No widgets: it connects the ChatModel (what is shown), the store (what is saved) and the engine client, and the
window (app/main_window.py) only forwards what the person does to it; tests drive it directly. Its parts: the
response being written (app/chat/response.py: streaming, saving as it grows, the stall watch, Stop) and the answers
the store refused (app/chat/unsaved.py: held, retried, kept at close). A question that cannot be saved is not
sent, and says so (saveNotice).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.answers import GenerationRequest
from app.chat.model import ChatModel, continuable
from app.chat.response import Response
from app.chat.unsaved import STORE_ERRORS, UnsavedAnswers, store_problem
from app.conversations.store import ConversationStore, Message, MessageTree
from app.settings.presets import Preset, PresetBook
from app.settings.values import AppSettings
from app.worker import EngineClient
from engine.reasoning import without_thinking
from engine.remote.endpoint import Endpoint
from engine.text_rules import plain_name, valid_text

log = logging.getLogger(__name__)

TITLE_CHARS = 48


storable = valid_text  # text as it can be saved and tokenized (engine.text_rules)


def title_from(text: str) -> str:
    line = plain_name(text)
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def retitle(store: ConversationStore, conversation_id: int, old: str, new: str) -> bool:
    """The conversation's first question shown changed from old to new: a title made from old follows it (True); one
    the user chose stays."""
    conv = store.conversation(conversation_id)
    if conv is not None and conv.title == title_from(old) != title_from(new):
        store.rename(conversation_id, title_from(new))
        return True
    return False


class ChatSession(QObject):
    """The chat's controller (see above): the window's chat without its widgets."""

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
        self.held = UnsavedAnswers(store, lambda: self.response.message, self)
        self.held.notice.connect(self.saveNotice)
        self.held.touched.connect(self.conversationsChanged)
        self.response = Response(engine, store, self.model, self.held, lambda: self.model_name, self)
        self.response.busyChanged.connect(self.busyChanged)
        self.response.finished.connect(self.responseFinished)
        self.response.failed.connect(self.responseFailed)
        self.response.noticeRaised.connect(self.noticeRaised)
        self.response.conversationChanged.connect(self.conversationsChanged)

    @property
    def busy(self) -> bool:
        return self.response.busy

    @property
    def streaming(self) -> Message | None:
        """The response being written (maybe in another conversation)."""
        return self.response.message

    @property
    def request(self) -> GenerationRequest | None:
        return self.response.request

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
        live = self.held.messages()
        if self.streaming is not None and self.streaming.id is not None:  # (one not saved yet is in no tree)
            live[self.streaming.id] = self.streaming
        messages = [live.get(m.id, m) if m.id is not None else m for m in messages]
        return messages, [tree.siblings(m) for m in messages]

    def new_conversation(self) -> None:
        """An empty chat; it is saved when its first message is sent."""
        self.open(None)

    def forget(self, conversation_id: int) -> None:
        """The conversation was deleted: stop writing into it and close it if open."""
        if self.response.conversation_id == conversation_id:
            self.response.abandon()  # nothing left to save it into
        self.held.forget(conversation_id)
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
        user_id = self.store.add_message(self._open_id(), user, parent=parent)
        return self._add_reply(user_id, settings)

    def _add_reply(self, parent: int, settings: Preset) -> Message:
        reply = Message(id=None, role="assistant", status="streaming", model=self.answering_model(settings))
        self.store.add_message(self._open_id(), reply, parent=parent)
        return reply

    def _open_id(self) -> int:
        """The open conversation's id, for writing into it: a message is written only into an open conversation
        (a message shown belongs to it; send creates a new chat's conversation before it writes)."""
        if self.conversation_id is None:
            raise RuntimeError("no conversation is open to write into")
        return self.conversation_id

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
                written = reply, self.store.tree(self._open_id()), settings
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
        parent = message.parent_id  # not None: checked above
        turn = self._written(lambda settings: self._add_reply(parent, settings))
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
                retitle(self.store, self._open_id(), message.content, text)  # _start says it changed
            return self._add_turn(text, message.parent_id, settings)

        turn = self._written(write)
        return turn is not None and self._start(*turn)

    def continue_answer(self, message: Message | None = None) -> bool:
        """Write more of the last answer, cut short by the length limit or a stop, into the same message."""
        items = self.model.items
        message = message if message is not None else (items[-1] if items else None)
        if self.busy or not items or message is not items[-1] or not continuable(message):
            return False
        request = self._request(items, self.chat_settings(), continue_last=True)
        self.response.resume(message, self.conversation_id, request)
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
        self.model.show_path(*self._path())
        cid = self.conversation_id
        first_question = message.parent_id is None and message.role == "user" and self.model.items
        if (
            first_question
            and cid is not None
            and retitle(self.store, cid, message.content, self.model.items[0].content)
        ):
            self.conversationsChanged.emit(cid)  # the title follows the question shown
        return True

    def stop(self) -> None:
        self.response.stop()

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
        self.response.message = reply  # shown live from here on (_path)
        self.model.show_path(*self._path(tree))
        self.conversationsChanged.emit(self.conversation_id)
        self.response.start(reply, self.conversation_id, self._request(self.model.items[:-1], settings))
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

    def _request(self, messages: list[Message], settings: Preset, continue_last: bool = False) -> GenerationRequest:
        """The engine request answering messages, with this chat's own settings (another chat's never leak in)."""
        return GenerationRequest(
            messages=self.prompt_history(messages, continue_last, settings),
            sampling=settings.sampling(),
            max_tokens=settings.max_tokens,
            continue_last=continue_last,
            remote=self.remote_endpoint(settings),
        )

    # --- answers the store refused ------------------------------------------------------------
    @property
    def unsaved(self) -> int:
        """How many answers are held in memory because the store refused them."""
        return len(self.held)

    def save_unsaved(self) -> bool:
        """Save the answers the store refused, if it takes them now: True once none is left."""
        return self.held.save()

    def keep_held(self) -> Path | None:
        """The answers the store still refuses, written where the next start saves them into the store
        (held_answers.py): where, or None if nowhere took them. Asked again with nothing changed, not written again."""
        return self.held.keep()

    def close(self) -> bool:
        """The app is closing: whatever is still streaming is saved as stopped, and answers held are tried once
        more, or else kept for the next start (keep_held). False if something could be neither (it is dropped: the
        caller tells the user)."""
        self.response.close()
        saved = self.save_unsaved() or self.keep_held() is not None
        self.held.drop()  # the store closes next: a later close has nothing to ask about
        return saved
