"""The main window: conversations on the left, the chat on the right, model state below."""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QByteArray, QCoreApplication, QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QGuiApplication, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.attachments import AttachmentTray, FileDrops, compose, paperclip_icon, split_attachments
from app.chat.context_meter import ContextMeter, TokenCounter
from app.chat.input_box import ChatInput
from app.chat.message_view import ChatView
from app.chat.session import ChatSession, storable
from app.chat.settings_panel import ChatSettingsButton
from app.conversations.imported_settings import use_imported_settings
from app.conversations.importing import ConversationImport
from app.conversations.sidebar import ConversationPanel
from app.conversations.store import ConversationStore
from app.notices import NoticeArea
from app.safe_text import install_guards
from app.settings.presets import load_presets
from app.settings.values import METHOD_LABELS, AppSettings, save_settings, what_changed
from app.status_bar import StatusBar
from app.theme import LABELS as THEME_LABELS
from app.theme import apply_theme
from app.worker import EngineClient
from engine.errors import InvalidSettingError
from engine.methods import DRAFT_METHODS
from engine.modelfiles.embedded import EMBEDDED
from engine.reasoning import without_thinking
from engine.text_rules import plain_name

log = logging.getLogger(__name__)

EMBEDDED_NOTICE = (
    "**You are chatting with the built-in demo model**, SmolLM2 135M Instruct: a tiny assistant that runs "
    "offline with no set-up. It answers simple questions but often makes mistakes, so check what it says. "
    "For a real assistant, open **Model → Models…** to download a target model with a matching draft model "
    "(a *model pair*), or choose your own GGUF files in **Model → Settings…**."
)


class MainWindow(QMainWindow):
    modelLoaded = Signal(object)  # model info dict
    modelFailed = Signal(str)
    speculationChanged = Signal(object)  # {"method", "draft_name", ...} once the engine applied it

    def __init__(self, settings: AppSettings, store: ConversationStore, notices: list[str] = (), parent=None):
        super().__init__(parent)
        install_guards()  # before any label or tooltip shows outside text (safe_text.py)
        apply_theme(settings.theme)
        self.setWindowTitle("SpecChat")
        self.settings = settings
        self.store = store
        self.engine = EngineClient(self)
        self.presets, preset_notices = load_presets(settings)  # system prompt and sampling, per chat
        self.session = ChatSession(store, self.engine, lambda: self.settings, self, presets=lambda: self.presets)
        self.model_info: dict | None = None
        self.working = ""  # what the engine is busy with besides loading, for the status bar
        self.loading = False
        self.editing = False
        self.edited = None  # the message being edited: its new text is sent as a branch beside it
        self._lab = None
        self._compare = None
        self._system_check = None
        self._server = None
        self._models_dialog = None
        self._changed_conversation: int | None = None
        self._closed = False  # closeEvent accepted: an import that ends later shows nothing
        self._imports = ConversationImport(
            store, lambda: self.presets.default, lambda name, carried: use_imported_settings(self, name, carried), self
        )
        self._make_widgets(settings)
        self._lay_out()
        self._build_status_bar()
        self._build_menus()
        self._connect_view()
        self._connect_engine()
        self._restore(settings, list(notices), preset_notices)

    def _make_widgets(self, settings: AppSettings) -> None:
        self.panel = ConversationPanel(self.store)
        self.notices = NoticeArea()
        self.view = ChatView()
        self.view.setModel(self.session.model)
        self.view.set_color_drafts(settings.color_drafts)
        self.view.set_show_sparkline(settings.show_sparkline)
        self.input = ChatInput()
        self.counter = TokenCounter(self)  # the loaded model's tokenizer, on a thread of its own
        self.meter = ContextMeter(self.counter, self._prompt_so_far, remote=self.session.remote_endpoint)
        self.tray = AttachmentTray(self.counter, self.meter.message_budget)  # files to go with the next message
        self.attach_button = QToolButton(
            text="Attach",
            autoRaise=True,
            icon=paperclip_icon(self.palette().color(QPalette.ColorRole.ButtonText)),
            toolTip="Attach text files (code, Markdown, CSV, logs): their text goes into "
            "your message. You can also drop files on the window.",
        )
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.setMinimumWidth(90)
        self.edit_label = QLabel(
            "Editing a message: Enter sends it as a new branch (the old one is kept), Esc cancels.", wordWrap=True
        )
        # Its own row, wrapped, free to shrink: beside the checkboxes it widened the chat, narrowing the sidebar.
        self.edit_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.input.setToolTip("Enter sends, Shift+Enter starts a new line, Esc stops a response being written.")
        self.edit_label.hide()
        self.color_toggle = QCheckBox("Colour accepted draft tokens")
        self.color_toggle.setToolTip("Highlight the text that came from drafts the target model accepted.")
        self.color_toggle.setChecked(settings.color_drafts)
        self.sparkline_toggle = QCheckBox("Speed sparkline")
        self.sparkline_toggle.setChecked(settings.show_sparkline)
        self.empty_hint = QLabel("Send a message to start a conversation.")
        self.empty_hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_hint.setForegroundRole(QPalette.ColorRole.PlaceholderText)

    def _lay_out(self) -> None:
        options = QHBoxLayout()
        self.chat_settings_button = ChatSettingsButton(self.session)
        options.addWidget(self.chat_settings_button)
        options.addStretch(1)
        options.addWidget(self.color_toggle)
        options.addWidget(self.sparkline_toggle)
        entry = QHBoxLayout()
        entry.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
        entry.addWidget(self.input, 1)
        entry.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        right = QWidget()
        column = QVBoxLayout(right)
        column.setContentsMargins(0, 0, 8, 8)
        column.addWidget(self.notices)
        column.addWidget(self.view, 1)
        column.addWidget(self.empty_hint, 1)
        column.addLayout(options)
        column.addWidget(self.tray)
        column.addWidget(self.edit_label)
        column.addLayout(entry)
        column.addWidget(self.meter)
        self.splitter = QSplitter()
        self.splitter.addWidget(self.panel)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([240, 760])
        self.setCentralWidget(self.splitter)

    def _build_status_bar(self) -> None:
        bar = StatusBar()  # its segments shrink and elide together: nothing overlaps at any width
        self.setStatusBar(bar)
        self.model_label, self.progress, self.spec_label = bar.model_label, bar.progress, bar.spec_label
        self.server_label = bar.server_label
        self.engine_label = bar.engine_label  # the open chat's remote engine, when it has one

    def _connect_view(self) -> None:
        """The chat's own widgets, the conversation list and the session, to the window."""
        self.input.sendRequested.connect(self.send_message)  # Enter never stops a response: only Stop/Esc do
        self.input.cancelRequested.connect(self.escape)
        self.attach_button.clicked.connect(self.choose_files)
        self.input.filesDropped.connect(self.tray.add_files)
        self._drops = FileDrops(self, self.tray.add_files)  # files dropped anywhere on the window
        self.tray.refused.connect(lambda text: self.notices.show_notice(text, "warning"))
        for changed in (
            self.input.textChanged,
            self.tray.changed,
            self.session.model.modelReset,
            self.session.model.rowsInserted,
            self.session.model.rowsRemoved,
            self.session.responseFinished,
        ):
            changed.connect(lambda *_: self.meter.schedule())  # counted again a moment after the last change
        self.session.model.modelReset.connect(self.meter.restart)  # another chat: its count, never the last one's
        self.send_button.clicked.connect(self.send_or_stop)
        self.view.editRequested.connect(self.start_edit)
        self.view.regenerateRequested.connect(self.session.regenerate)
        self.view.continueRequested.connect(self.session.continue_answer)
        self.view.branchRequested.connect(self.session.switch_branch)
        self.color_toggle.toggled.connect(self._set_color_drafts)
        self.sparkline_toggle.toggled.connect(self._set_sparkline)
        self.panel.conversationSelected.connect(self.open_conversation)
        self.panel.newRequested.connect(self.new_chat)
        self.panel.deleted.connect(self._conversation_deleted)
        self.panel.renamed.connect(lambda _cid: self._update_title())
        self.chat_settings_button.changed.connect(self.meter.schedule)
        self.chat_settings_button.refreshed.connect(self._show_chat_engine)
        self.session.busyChanged.connect(self._busy_changed)
        self.session.noticeRaised.connect(lambda text, level: self.notices.show_notice(text, level))
        self.session.saveNotice.connect(self._save_notice)
        self.session.conversationsChanged.connect(self._conversations_changed)
        self._list_refresh = QTimer(self, singleShot=True, interval=0)  # list updates go in their own turn
        self._list_refresh.timeout.connect(self._refresh_list)
        self.session.model.modelReset.connect(self._update_empty)
        self.session.model.rowsInserted.connect(self._update_empty)
        self.session.model.rowsRemoved.connect(self._update_empty)

    def _connect_engine(self) -> None:
        """The engine worker's signals (a model loaded or failed, the server, notices)."""
        w = self.engine.worker
        w.loadStarted.connect(self._load_started)
        w.working.connect(self._engine_working)
        w.loaded.connect(self._loaded)
        w.loadFailed.connect(self._load_failed)
        w.speculationApplied.connect(self._speculation_applied)
        w.notice.connect(self._engine_notice)  # a method, not a lambda: it must run on the GUI thread
        w.serverStarted.connect(self._server_started)
        w.serverStopped.connect(self._server_stopped)
        w.serverFailed.connect(self._server_stopped)

    def _restore(self, settings: AppSettings, notices: list[str], preset_notices: list[str]) -> None:
        """Startup: the notices, the window's geometry, the latest conversation, then the models."""
        for text in preset_notices:
            log.warning("%s", text)
        for text in [*notices, *preset_notices]:
            self.notices.show_notice(text, "warning")
        if settings.window_geometry:
            self.restoreGeometry(QByteArray.fromBase64(settings.window_geometry.encode()))
        else:
            self.resize(1100, 760)
        if settings.splitter_state:
            self.splitter.restoreState(QByteArray.fromBase64(settings.splitter_state.encode()))
        conversations = self.store.conversations()
        if conversations:
            self.panel.select(conversations[0].id)
            self.open_conversation(conversations[0].id)
        else:
            self._update_empty()
        self._update_send_button()
        if self._skip_model_that_crashed():
            self.load_models()

    # --- menus --------------------------------------------------------------------------------
    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self._action(file_menu, "&New chat", self.new_chat, QKeySequence.StandardKey.New)
        self._action(file_menu, "Chat &settings…", self.chat_settings_button.open_dialog)
        file_menu.addSeparator()
        self._action(file_menu, "&Export conversation…", self.export_conversation)
        self._action(file_menu, "&Import conversation…", self.import_conversation)
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        edit_menu = self.menuBar().addMenu("&Edit")
        self._action(edit_menu, "&Copy last answer", self.copy_last_answer, QKeySequence("Ctrl+Shift+C"))
        self._build_view_menu(self.menuBar().addMenu("&View"))
        model_menu = self.menuBar().addMenu("&Model")
        self._action(model_menu, "&Models…", self.open_models_dialog)
        self._action(model_menu, "Speculation &lab…", self.open_lab)
        self._action(model_menu, "&Compare plain vs speculation…", self.open_compare)
        self._action(model_menu, "Se&rver…", self.open_server)
        self._action(model_menu, "&Settings…", self.open_settings, QKeySequence.StandardKey.Preferences)
        model_menu.addSeparator()
        self._action(model_menu, "&Reload model", self.load_models)
        help_menu = self.menuBar().addMenu("&Help")
        self._action(help_menu, "System &check…", self.open_system_check)
        self._action(help_menu, "About the &figures", self._explain_figures)
        self._action(help_menu, "&About SpecChat", self._about)

    def _build_view_menu(self, view_menu) -> None:
        """View → Theme: light, dark or the system's, one checked; applied at once and kept."""
        themes = view_menu.addMenu("&Theme")
        group = QActionGroup(self)
        self.theme_actions = {}
        for theme, label in THEME_LABELS.items():
            action = QAction(label, self, checkable=True, checked=theme == self.settings.theme)
            action.triggered.connect(lambda _checked=False, theme=theme: self.set_theme(theme))
            group.addAction(action)
            themes.addAction(action)
            self.theme_actions[theme] = action

    def _action(self, menu, text, slot, shortcut=None) -> QAction:
        action = QAction(text, self)
        # triggered(bool) would hand its `checked` to the slot's first parameter (Export took False as a path).
        action.triggered.connect(lambda _checked=False: slot())
        if shortcut is not None:
            action.setShortcut(shortcut)
        menu.addAction(action)
        return action

    def set_theme(self, theme: str) -> None:
        apply_theme(theme)
        self.theme_actions[theme].setChecked(True)
        if theme != self.settings.theme:
            self._store_settings(self.settings.merged({"theme": theme}))

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:  # a theme applied: the drawn icon takes its text colour
            self.attach_button.setIcon(paperclip_icon(self.palette().color(QPalette.ColorRole.ButtonText)))

    # --- chat ---------------------------------------------------------------------------------
    def copy_last_answer(self) -> None:
        """Edit → Copy last answer: the newest answer's text, as its Copy button copies it (without its thought)."""
        answers = [m for m in self.session.model.items if m.role == "assistant" and m.content.strip()]
        if not answers:
            self.statusBar().showMessage("There is no answer to copy yet.", 4000)
            return
        QGuiApplication.clipboard().setText(without_thinking(answers[-1].content).strip())
        self.statusBar().showMessage("The last answer was copied.", 3000)

    def send_or_stop(self) -> None:
        if self.session.busy:
            self.session.stop()
        else:
            self.send_message()

    def send_message(self) -> None:
        if self.session.busy:
            self.statusBar().showMessage("A response is being written: wait for it, or press Esc to stop it.", 4000)
            return
        if self.tray.pending:
            self.statusBar().showMessage("An attached file is still being checked: send again in a moment.", 4000)
            return
        text = compose(self.input.toPlainText(), self.tray.attachments)
        if not text.strip():
            return
        sent = self.session.resend_edited(text, self.edited) if self.editing else self.session.send(text)
        if sent:
            self.input.clear()
            self.tray.clear()
            self.cancel_edit()

    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self,
            "Attach text files",
            "",
            "Text files (*.txt *.md *.csv *.log *.json *.py *.js *.ts *.c *.h "
            "*.cpp *.rs *.go *.java *.html *.css *.yaml *.yml *.toml *.ini *.sh "
            "*.sql *.xml);;All files (*)",
        )
        self.tray.add_files(paths)

    def _prompt_so_far(self) -> tuple[list[dict], int]:
        """The messages the next send would give the model (for the context meter), and its max tokens."""
        items = self.session.model.items
        if self.editing and self.edited is not None and self.session.model.row_of(self.edited) >= 0:
            items = items[: self.session.model.row_of(self.edited)]  # the edited message replaces what follows
        messages = self.session.prompt_history(items)
        draft = storable(compose(self.input.toPlainText(), self.tray.attachments)).strip()
        if draft:
            messages.append({"role": "user", "content": draft})
        return messages, self.session.chat_settings().max_tokens

    def escape(self) -> None:
        """Esc: stop the response being written, or leave editing."""
        if self.session.busy:
            self.session.stop()
        else:
            self.cancel_edit()

    def start_edit(self, message) -> None:
        if self.session.busy:
            return
        self.editing, self.edited = True, message
        text, files = split_attachments(message.content)
        self.input.setPlainText(text)
        self.tray.set_files(files)
        self.input.setFocus()
        self.edit_label.show()

    def cancel_edit(self) -> None:
        if self.editing:
            self.editing, self.edited = False, None
            self.edit_label.hide()

    def new_chat(self) -> None:
        self.cancel_edit()
        self.session.new_conversation()
        self.chat_settings_button.refresh()
        self._update_title()
        self.panel.list.clearSelection()
        self.panel.list.setCurrentIndex(self.panel.model.index(-1))
        self.input.setFocus()

    def open_conversation(self, conversation_id: int) -> None:
        self.cancel_edit()
        self.session.open(conversation_id)
        self.chat_settings_button.refresh()
        self._update_title()

    def _conversation_deleted(self, conversation_id: int) -> None:
        was_open = self.session.conversation_id == conversation_id
        self.session.forget(conversation_id)
        if was_open:  # nothing of it may linger: an edit in progress, its preset, its title, its files
            self.cancel_edit()
            self.tray.clear()
            self.chat_settings_button.refresh()
            self._update_title()

    def _show_chat_engine(self) -> None:
        """The status bar's model and speculation are this machine's; a chat on a server says so beside them."""
        remote = self.session.remote_endpoint()
        self.engine_label.setText(f"This chat: remote engine at {remote.host}" if remote else "")
        self.engine_label.setToolTip(
            f"{remote.url} answers this chat (its chat settings); the model and "
            "speculation on the left are this machine's."
            if remote
            else ""
        )
        self.engine_label.setVisible(remote is not None)
        self.notices.set_hidden("embedded", remote is not None)  # the demo model does not answer this chat

    def _update_title(self) -> None:
        cid = self.session.conversation_id
        conv = self.store.conversation(cid) if cid is not None else None
        # Plain: a bidi control or zero-width character in a title must not disguise what the title bar says.
        self.setWindowTitle(f"{plain_name(conv.title)} — SpecChat" if conv else "SpecChat")

    def _conversations_changed(self, conversation_id: int) -> None:
        self._changed_conversation = conversation_id
        self._list_refresh.start()

    def _refresh_list(self) -> None:
        current = self.session.conversation_id
        self.panel.reload(current if current is not None else self._changed_conversation)
        self._update_title()

    def _busy_changed(self, busy: bool) -> None:
        self.view.set_busy(busy)
        self._update_send_button()

    def _update_send_button(self) -> None:
        busy = self.session.busy
        self.send_button.setText("Stop" if busy else "Send")
        self.send_button.setToolTip("Stop writing (the text so far is kept)" if busy else "Send (Enter)")

    def _update_empty(self, *_args) -> None:
        empty = self.session.model.rowCount() == 0
        self.view.setVisible(not empty)
        self.empty_hint.setVisible(empty)

    def _set_color_drafts(self, on: bool) -> None:
        self.view.set_color_drafts(on)
        self._store_settings(self.settings.merged({"color_drafts": on}))

    def _set_sparkline(self, on: bool) -> None:
        self.view.set_show_sparkline(on)
        self._store_settings(self.settings.merged({"show_sparkline": on}))

    # --- export and import --------------------------------------------------------------------
    def _file_folder(self) -> Path:
        """Where the export and import dialogs start: the folder of the last file chosen, while it exists."""
        folder = Path(self.settings.last_folder) if self.settings.last_folder else None
        return folder if folder is not None and folder.is_dir() else Path.home()

    def _remember_folder(self, path: str) -> None:
        folder = str(Path(path).parent)
        if folder != self.settings.last_folder:
            self._store_settings(self.settings.merged({"last_folder": folder}))

    def export_conversation(self, path: str | Path | None = None) -> bool:
        """The open conversation to a file: .json holds every branch, anything else is Markdown. Without
        a path, asks for one."""

        from app.conversations.files import export_json, export_markdown, suggested_file_name

        cid = self.session.conversation_id
        if cid is None:
            self.statusBar().showMessage("Open a conversation to export it.", 4000)
            return False
        if path is None:
            markdown, everything = "Markdown, the branch shown (*.md)", "JSON, every branch (*.json)"
            start = str(self._file_folder() / suggested_file_name(self.store.conversation(cid).title, ".md"))
            path, chosen = QFileDialog.getSaveFileName(self, "Export conversation", start, f"{markdown};;{everything}")
            if not path:
                return False
            if not Path(path).suffix:
                path += ".json" if chosen == everything else ".md"
            self._remember_folder(path)
        path = Path(path)
        try:
            (export_json if path.suffix.lower() == ".json" else export_markdown)(self.store, cid, path)
        except OSError as exc:
            self.notices.show_notice(
                f"The conversation could not be written to {path}: {exc.strerror or exc}.", "error", key="export"
            )
            return False
        self.statusBar().showMessage(f"Exported to {path}", 6000)
        return True

    def import_conversation(self, path: str | Path | None = None) -> int | None:
        """A JSON export as a new conversation, opened; its id, or None if refused. Without a path, asks. The file
        is read, checked and stored on the import thread (app.conversations.importing); this returns when that is
        done, the window live meanwhile. Settings in it that would change where messages go or what goes with
        them are used only if the person says so."""
        if self._imports.busy:
            self.notices.show_notice(
                f"{Path(self._imports.path).name} is still being imported; import the next file once it is done.",
                "info",
                key="import-busy",
            )
            return None
        if path is None:
            path, _ = QFileDialog.getOpenFileName(
                self, "Import conversation", str(self._file_folder()), "SpecChat conversation (*.json);;All files (*)"
            )
            if not path:
                return None
            self._remember_folder(path)
        self.statusBar().showMessage(f"Importing {Path(path).name}…")
        result = self._imports.run(str(path))
        if self._closed:
            return None
        self.statusBar().clearMessage()
        if isinstance(result, str):
            self.notices.show_notice(result, "error", key="import")
            return None
        self.notices.clear("import")
        self.panel.reload(result)
        self.open_conversation(result)
        return result

    # --- models and settings ------------------------------------------------------------------
    def _skip_model_that_crashed(self) -> bool:
        """After a crash while loading a model, start without it and say so, rather than crash again.
        False when nothing should be loaded now (the model that crashed is the embedded one)."""
        note = self.engine.worker.marker.left_over()
        if note is None:
            return True
        name = "the embedded demo model" if note["model"] == EMBEDDED else Path(note["model"]).name
        advice = (
            "If it ran out of memory, lower the GPU layers or the context size in Model → Settings… "
            "before trying it again."
        )
        log.warning("the last run ended while loading %s (%s); not loading it again", note["model"], note["role"])
        if note["role"] == "draft":
            self._store_settings(self.settings.merged({"method": "lookup"}))
            self.notices.show_notice(
                f"SpecChat closed while loading the draft model {name} last time, so "
                f"speculation uses prompt lookup for now. {advice}",
                "warning",
                key="crashed",
            )
            return True
        if note["model"] == EMBEDDED:
            self.notices.show_notice(
                f"SpecChat closed while loading {name} last time, so no model was loaded "
                f"this time. {advice} Model → Reload model tries again.",
                "error",
                key="crashed",
            )
            return False
        changes = {"model": EMBEDDED}
        if self.settings.method in DRAFT_METHODS:
            changes["method"] = "lookup"  # its draft was chosen for the model that crashed
        self._store_settings(self.settings.merged(changes))
        self.notices.show_notice(
            f"SpecChat closed while loading {name} last time, so it was not loaded again: "
            f"the embedded demo model is loaded instead. {advice} Choose it again in "
            "Model → Settings… to retry.",
            "warning",
            key="crashed",
        )
        return True

    def load_models(self) -> None:
        try:
            decoder_settings = self.settings.decoder_settings()
        except InvalidSettingError as exc:
            self.notices.show_notice(f"The model settings are not usable: {exc}", "error", key="load")
            return
        self.session.stop()
        self.loading = True
        self.engine.load(decoder_settings)
        if self.settings.model == EMBEDDED:
            self.notices.show_notice(EMBEDDED_NOTICE, "info", key="embedded")
        else:
            self.notices.clear("embedded")

    def _engine_notice(self, text: str) -> None:
        self.notices.show_notice(text, "warning")

    def _engine_working(self, what: str) -> None:
        """The engine works on something a message sent now would wait for (timing its steps): said in the
        status bar, the window usable meanwhile."""
        self.working = what
        self.progress.setVisible(self.loading or bool(what))
        if what:
            self.statusBar().showMessage(what)
        else:
            self.statusBar().clearMessage()

    def _load_started(self, what: str) -> None:
        self.progress.show()
        self.model_label.setText(f"Loading {what}…")

    def _loaded(self, info: dict) -> None:
        self.loading = False
        self.model_info = info
        self.session.model_name = info["name"]
        self.progress.setVisible(bool(self.working))
        self.notices.clear("load")
        fmt = "chat template" if info["chat_template"] else "plain transcript format (no chat template)"
        self.model_label.setText(f"{info['name']}  ·  {info['backend']}  ·  {info['n_ctx']} ctx  ·  {fmt}")
        self.model_label.setToolTip(info["path"])
        self.counter.load(info["path"], info["n_ctx"])  # the context meter counts in this model's tokens
        self._speculation_applied(info)
        self.modelLoaded.emit(info)

    def _load_failed(self, message: str) -> None:
        self.loading = False
        self.model_info = None
        self.counter.unload()
        self.progress.hide()
        self.model_label.setText("No model loaded")
        self.spec_label.setText("")
        self.notices.show_notice(
            f"**The model could not be loaded.** {message}  \nChoose another file in "
            "Model → Settings… (empty target = the embedded demo model).",
            "error",
            key="load",
        )
        self.modelFailed.emit(message)

    def _speculation_applied(self, info: dict) -> None:
        self.progress.setVisible(self.loading or bool(self.working))
        method = info.get("method", "none")
        text = f"Speculation: {METHOD_LABELS.get(method, method).lower()}"
        if method in DRAFT_METHODS and info.get("draft_name"):
            text += f" ({info['draft_name']})"
        self.spec_label.setText(text)
        if self.model_info is not None:
            self.model_info.update(method=method, draft_name=info.get("draft_name"))
        self.speculationChanged.emit(info)

    def apply_settings(self, new: AppSettings) -> None:
        """Save new settings and apply them: reload the model, or change speculation, as needed."""
        old = self.settings
        change = what_changed(old, new)
        self._store_settings(new)
        if change == "reload":
            self.load_models()
        elif change == "speculation":
            self.engine.apply_speculation(new.decoder_settings())
        self._tell_lab()

    def _tell_lab(self) -> None:
        """The lab measures, and offers to apply, for the chat's own models and speculation."""
        if self._lab is not None:
            s = self.settings
            self._lab.set_chat_models(s.model, s.draft, s.effective_method, s.max_draft, s.adaptive)

    def _store_settings(self, new: AppSettings) -> None:
        self.settings = new
        try:
            save_settings(new)
        except OSError as exc:
            self.notices.show_notice(
                f"Settings could not be saved ({exc}); they apply until you quit.", "warning", key="save"
            )

    def open_settings(self) -> None:
        from app.settings.dialog import SettingsDialog

        dialog = SettingsDialog(self.settings, self)
        if dialog.exec() and dialog.result_settings is not None:
            self.apply_settings(dialog.result_settings)

    def open_models_dialog(self) -> None:
        if self._models_dialog is not None and self._models_dialog.isVisible():
            self._models_dialog.raise_()  # it may be downloading: never open a second one
            self._models_dialog.activateWindow()
            return
        try:
            from app.models.dialog import ModelsDialog

            dialog = ModelsDialog(self.settings.model, self.settings.draft, self)
        except Exception as exc:  # noqa: BLE001 - an optional part missing or broken must not end the app
            log.exception("models dialog")
            QMessageBox.warning(
                self,
                "Models",
                f"The model manager could not be opened: {exc}\n\n"
                "You can still choose GGUF files in Model → Settings….",
            )
            return
        dialog.modelsChosen.connect(self.use_models)
        self._models_dialog = dialog
        dialog.show()

    def use_models(self, target: str, draft: str | None) -> None:
        s = self.settings
        changes = {"model": target or EMBEDDED, "draft": draft}
        if draft:  # a pair: lookup and its draft, chosen per step
            changes.update(method="auto", speculation=True)
        elif s.method in DRAFT_METHODS:
            changes.update(method="lookup")
        try:
            self.apply_settings(s.merged(changes).validated())
        except InvalidSettingError as exc:
            self.notices.show_notice(f"Those models could not be used: {exc}", "error")

    def open_lab(self) -> None:
        try:
            from app.lab.window import LabWindow

            if self._lab is None:
                self._lab = LabWindow()
                self._lab.applySettings.connect(self.apply_recommendation)
        except Exception as exc:  # noqa: BLE001
            log.exception("lab window")
            QMessageBox.warning(self, "Speculation lab", f"The speculation lab could not be opened: {exc}")
            return
        self._tell_lab()
        self._lab.show()
        self._lab.raise_()

    def open_server(self) -> None:
        """The OpenAI-compatible server on this window's engine."""
        from app.server.panel import ServerPanel

        if self._server is None:
            self._server = ServerPanel(self.engine, self.settings, self)
            self._server.optionsChanged.connect(lambda values: self._store_settings(self.settings.merged(values)))
        self._server.show()
        self._server.raise_()

    def _server_started(self, info: dict) -> None:
        self.server_label.setText(f"Serving at {info['url']}")
        self.server_label.show()

    def _server_stopped(self, *_args) -> None:
        self.server_label.hide()

    def open_compare(self) -> None:
        """The Compare view, on this window's engine; it starts with the text being typed, or the last question."""
        from app.compare.window import CompareWindow

        if self._compare is None:
            self._compare = CompareWindow(
                self.engine, lambda: self.settings, self, chat_settings=self.session.chat_settings
            )
        if not self._compare.running:
            users = [m.content for m in self.session.model.items if m.role == "user"]
            self._compare.set_prompt(self.input.toPlainText() or (users[-1] if users else ""))
        self._compare.show()
        self._compare.raise_()

    def open_system_check(self) -> None:
        """engine.doctor's report: the build, the devices, the VRAM reader, and a bench on this window's model."""
        from app.doctor.dialog import SystemCheckDialog

        if self._system_check is None:
            self._system_check = SystemCheckDialog(self._doctor_arguments, self)
        self._system_check.show()
        self._system_check.raise_()

    def _doctor_arguments(self) -> list[str]:
        s = self.settings
        draft = ["--draft", s.draft] if s.draft and s.effective_method in DRAFT_METHODS else []
        threads = ["--threads", str(s.threads)] if s.threads else []
        return ["--model", s.model, *draft, "--gpu-layers", str(s.n_gpu_layers), *threads]

    def apply_recommendation(self, changes: dict) -> None:
        changes = dict(changes)
        if changes.get("method") in ("draft", "lookup", "auto"):
            changes.setdefault("speculation", True)
        try:
            new = self.settings.merged(changes).validated()
        except (InvalidSettingError, TypeError) as exc:
            self.notices.show_notice(f"The lab's recommendation could not be applied: {exc}", "error")
            return
        self.apply_settings(new)
        shown = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in changes.items())
        self.notices.show_notice(
            f"Applied the lab's recommendation ({shown}); it takes effect from the next response.", "info", key="lab"
        )

    # --- help ---------------------------------------------------------------------------------
    def _explain_figures(self) -> None:
        QMessageBox.information(
            self,
            "The figures under each response",
            (
                "tok/s: decode speed, tokens after the first ÷ time after the first token.\n"
                "TTFT: time to the first token (mostly prompt processing).\n"
                "accepted %: drafted tokens the target kept ÷ drafted tokens it checked (drafted/accepted counts).\n"
                "tok/step: tokens produced per target model step, the bonus token included; 1.00 means "
                "speculation gained nothing.\n"
                "RAM/VRAM: memory in use, labelled by kind; backend: where llama.cpp runs the model.\n\n"
                "Every figure is measured while the response is written; n/a means it could not be measured.\n"
                "Speculative decoding here is lossless: the text has the same distribution as without it."
            ),
        )

    def _about(self) -> None:
        QMessageBox.about(
            self,
            "About SpecChat",
            (
                "SpecChat: chat with local GGUF models, faster with lossless speculative decoding, "
                "with honest live figures for every response."
            ),
        )

    # --- closing ------------------------------------------------------------------------------
    def _save_notice(self, text: str, level: str, key: str) -> None:
        """What the store refused (a full disk), or saved after all: one notice per key, the latest word."""
        if text:
            self.notices.show_notice(text, level, key=key)
        else:
            self.notices.clear(key)

    def _close_unsaved(self) -> bool:
        """An answer is still not saved (the disk is full): close anyway? Asked before anything stops, so No
        leaves the window as it was."""
        answer = QMessageBox.question(
            self,
            "Close SpecChat",
            "An answer is not saved: the conversation file cannot be written (the disk may be full). If you close "
            "now, that answer is lost; everything saved before is kept.\n\nClose anyway? (No: keep the window "
            "open, free some space, and it is saved within seconds.)",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        return answer == QMessageBox.StandardButton.Yes

    def closeEvent(self, event) -> None:
        # An answer the store still refuses is kept for the next start if it can be; only if not, closing asks.
        asked = not self.session.save_unsaved() and self.session.keep_held() is None
        if asked and not self._close_unsaved():
            event.ignore()
            return
        # A Compare run is cancelled too, and a system check's child stopped.
        for window in (self._lab, self._models_dialog, self._compare, self._system_check):
            if window is not None:
                window.close()
        self.session.stop()
        # Asked to stop, not waited for: the window closes at once, even while a model loads or a long chat is
        # counted. Their threads are kept until they end, and the app's exit waits for them (app.models.threads).
        self.engine.request_shutdown()
        self.counter.request_shutdown()
        self._closed = True
        self._imports.abandon()  # an import under way ends its wait (ConversationImport.abandon)
        QCoreApplication.sendPostedEvents()  # the last tokens and the final stats, if they arrived
        if not self.session.close() and not asked:  # refused only now, at its last save: say so, once
            log.error("an answer could not be saved as SpecChat closed")
            QMessageBox.warning(
                self,
                "Close SpecChat",
                "The answer being written could not be saved: the "
                "conversation file cannot be written (the disk may be full). Everything saved "
                "before is kept.",
            )
        try:
            self._store_settings(
                self.settings.merged(
                    {
                        "window_geometry": bytes(self.saveGeometry().toBase64()).decode(),
                        "splitter_state": bytes(self.splitter.saveState().toBase64()).decode(),
                    }
                )
            )
        except Exception:  # noqa: BLE001 - closing must never fail
            log.exception("saving the window layout")
        self._list_refresh.stop()
        self.meter.stop()  # a count scheduled by the last events would read the closed store
        self.store.close()
        super().closeEvent(event)
