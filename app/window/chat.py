"""What the person does in the main window's chat, forwarded to the chat's controller (app/chat/session.py): send
(with the files attached), stop, edit a message and send it as a new branch, copy the last answer, attach files,
and the conversation list (new, open, deleted, renamed) with the window's title."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog

from app.chat.attachments import compose, split_attachments
from app.chat.session import storable
from engine.reasoning import without_thinking
from engine.text_rules import plain_name

if TYPE_CHECKING:
    from app.conversations.store import Message
    from app.main_window import MainWindow

ATTACHABLE = (
    "Text files (*.txt *.md *.csv *.log *.json *.py *.js *.ts *.c *.h "
    "*.cpp *.rs *.go *.java *.html *.css *.yaml *.yml *.toml *.ini *.sh "
    "*.sql *.xml);;All files (*)"
)


class ChatActions:
    """The chat's actions and the message being edited (its new text is sent as a branch beside it)."""

    def __init__(self, window: MainWindow):
        self.window = window
        self.session = window.session
        self.editing = False
        self.edited: Message | None = None
        self._changed_conversation: int | None = None
        self.list_refresh = QTimer(window, singleShot=True, interval=0)  # list updates go in their own turn
        self.list_refresh.timeout.connect(self._refresh_list)

    def connect(self) -> None:
        """The chat's widgets, the conversation list and the session, to these actions."""
        w, session = self.window, self.session
        w.input.sendRequested.connect(self.send_message)  # Enter never stops a response: only Stop/Esc do
        w.input.cancelRequested.connect(self.escape)
        w.attach_button.clicked.connect(self.choose_files)
        w.send_button.clicked.connect(self.send_or_stop)
        w.view.editRequested.connect(self.start_edit)
        w.view.regenerateRequested.connect(session.regenerate)
        w.view.continueRequested.connect(session.continue_answer)
        w.view.branchRequested.connect(session.switch_branch)
        w.panel.conversationSelected.connect(self.open_conversation)
        w.panel.newRequested.connect(self.new_chat)
        w.panel.deleted.connect(self._conversation_deleted)
        w.panel.renamed.connect(lambda _cid: self.update_title())
        w.chat_settings_button.refreshed.connect(self.show_chat_engine)
        session.conversationsChanged.connect(self._conversations_changed)

    def copy_last_answer(self) -> None:
        """Edit → Copy last answer: the newest answer's text, as its Copy button copies it (without its thought)."""
        answers = [m for m in self.session.model.items if m.role == "assistant" and m.content.strip()]
        if not answers:
            self.window.statusBar().showMessage("There is no answer to copy yet.", 4000)
            return
        QGuiApplication.clipboard().setText(without_thinking(answers[-1].content).strip())
        self.window.statusBar().showMessage("The last answer was copied.", 3000)

    def send_or_stop(self) -> None:
        if self.session.busy:
            self.session.stop()
        else:
            self.send_message()

    def send_message(self) -> None:
        w = self.window
        if self.session.busy:
            w.statusBar().showMessage("A response is being written: wait for it, or press Esc to stop it.", 4000)
            return
        if w.tray.pending:
            w.statusBar().showMessage("An attached file is still being checked: send again in a moment.", 4000)
            return
        text = compose(w.input.toPlainText(), w.tray.attachments)
        if not text.strip():
            return
        sent = self.session.resend_edited(text, self.edited) if self.editing else self.session.send(text)
        if sent:
            w.input.clear()
            w.tray.clear()
            self.cancel_edit()

    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self.window, "Attach text files", "", ATTACHABLE)
        self.window.tray.add_files(paths)

    def prompt_so_far(self) -> tuple[list[dict], int]:
        """The messages the next send would give the model (for the context meter), and its max tokens."""
        model = self.session.model
        items = model.items
        if self.editing and self.edited is not None and model.row_of(self.edited) >= 0:
            items = items[: model.row_of(self.edited)]  # the edited message replaces what follows
        messages = self.session.prompt_history(items)
        draft = storable(compose(self.window.input.toPlainText(), self.window.tray.attachments)).strip()
        if draft:
            messages.append({"role": "user", "content": draft})
        return messages, self.session.chat_settings().max_tokens

    def escape(self) -> None:
        """Esc: stop the response being written, or leave editing."""
        if self.session.busy:
            self.session.stop()
        else:
            self.cancel_edit()

    def start_edit(self, message: Message) -> None:
        if self.session.busy:
            return
        self.editing, self.edited = True, message
        text, files = split_attachments(message.content)
        self.window.input.setPlainText(text)
        self.window.tray.set_files(files)
        self.window.input.setFocus()
        self.window.edit_label.show()

    def cancel_edit(self) -> None:
        if self.editing:
            self.editing, self.edited = False, None
            self.window.edit_label.hide()

    # --- the conversation list ------------------------------------------------------------------
    def new_chat(self) -> None:
        w = self.window
        self.cancel_edit()
        self.session.new_conversation()
        w.chat_settings_button.refresh()
        self.update_title()
        w.panel.list.clearSelection()
        w.panel.list.setCurrentIndex(w.panel.model.index(-1))
        w.input.setFocus()

    def open_conversation(self, conversation_id: int) -> None:
        self.cancel_edit()
        self.session.open(conversation_id)
        self.window.chat_settings_button.refresh()
        self.update_title()

    def _conversation_deleted(self, conversation_id: int) -> None:
        was_open = self.session.conversation_id == conversation_id
        self.session.forget(conversation_id)
        if was_open:  # nothing of it may linger: an edit in progress, its preset, its title, its files
            self.cancel_edit()
            self.window.tray.clear()
            self.window.chat_settings_button.refresh()
            self.update_title()

    def show_chat_engine(self) -> None:
        """The status bar's model and speculation are this machine's; a chat on a server says so beside them."""
        self.window.status.chat_engine(self.session.remote_endpoint())

    def update_title(self) -> None:
        cid = self.session.conversation_id
        conv = self.window.store.conversation(cid) if cid is not None else None
        # Plain: a bidi control or zero-width character in a title must not disguise what the title bar says.
        self.window.setWindowTitle(f"{plain_name(conv.title)} — SpecChat" if conv else "SpecChat")

    def _conversations_changed(self, conversation_id: int) -> None:
        self._changed_conversation = conversation_id
        self.list_refresh.start()

    def _refresh_list(self) -> None:
        current = self.session.conversation_id
        self.window.panel.reload(current if current is not None else self._changed_conversation)
        self.update_title()
