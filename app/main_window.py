"""The main window: conversations on the left, the chat on the right, model state below.

MainWindow makes the widgets, lays them out, wires the chat's controller (app/chat/session.py) to them, and closes.
Its concerns live in app/window/: the chat's actions (chat.py), the conversation files (files.py), the models and
the engine (models.py), the status bar's words (status.py), the other windows (tools.py) and the menus (menus.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from PySide6.QtCore import QByteArray, QCoreApplication, QEvent, Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QCheckBox,
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

from app.chat.attachments import AttachmentTray, FileDrops, paperclip_icon
from app.chat.context_meter import ContextMeter, TokenCounter
from app.chat.input_box import ChatInput
from app.chat.message_view import ChatView
from app.chat.session import ChatSession
from app.chat.settings_panel import ChatSettingsButton
from app.conversations.sidebar import ConversationPanel
from app.conversations.store import ConversationStore
from app.notices import NoticeArea
from app.safe_text import install_guards
from app.settings.presets import load_presets
from app.settings.values import AppSettings, save_settings
from app.status_bar import StatusBar
from app.theme import apply_theme
from app.window.chat import ChatActions
from app.window.files import ConversationFiles
from app.window.menus import Menus
from app.window.models import ModelControl
from app.window.status import WindowStatus
from app.window.tools import ToolWindows
from app.worker import EngineClient

log = logging.getLogger(__name__)


class MainWindow(QMainWindow):
    modelLoaded = Signal(object)  # model info dict
    modelFailed = Signal(str)
    speculationChanged = Signal(object)  # {"method", "draft_name", ...} once the engine applied it

    def __init__(self, settings: AppSettings, store: ConversationStore, notices: Sequence[str] = (), parent=None):
        super().__init__(parent)
        install_guards()  # before any label or tooltip shows outside text (safe_text.py)
        apply_theme(settings.theme)
        self.setWindowTitle("SpecChat")
        self.settings = settings
        self.store = store
        self.engine = EngineClient(self)
        self.presets, preset_notices = load_presets(settings)  # system prompt and sampling, per chat
        self.session = ChatSession(store, self.engine, lambda: self.settings, self, presets=lambda: self.presets)
        self._make_widgets(settings)
        self._lay_out()
        self.status = WindowStatus(self.status_bar, self.notices)
        self.files = ConversationFiles(self)
        self.tools = ToolWindows(self)
        self.models = ModelControl(self)  # connected to the engine's signals from here on
        self.chat = ChatActions(self)
        self.menus = Menus(self)
        self._connect_view()
        self.chat.connect()
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
        self.meter = ContextMeter(self.counter, lambda: self.chat.prompt_so_far(), remote=self.session.remote_endpoint)
        self.tray = AttachmentTray(self.counter, self.meter.message_budget)  # files to go with the next message
        self.attach_button = QToolButton(autoRaise=True)
        self.attach_button.setText("Attach")
        self.attach_button.setIcon(paperclip_icon(self.palette().color(QPalette.ColorRole.ButtonText)))
        self.attach_button.setToolTip(
            "Attach text files (code, Markdown, CSV, logs): their text goes into "
            "your message. You can also drop files on the window."
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
        self.status_bar = bar = StatusBar()  # its segments shrink and elide together: nothing overlaps at any width
        self.setStatusBar(bar)
        self.model_label, self.progress, self.spec_label = bar.model_label, bar.progress, bar.spec_label
        self.server_label = bar.server_label
        self.engine_label = bar.engine_label  # the open chat's remote engine, when it has one

    def _connect_view(self) -> None:
        """The window's own widgets and the session's state, to what shows them (the chat's actions connect in
        app/window/chat.py)."""
        self.input.filesDropped.connect(self.tray.add_files)
        self._drops = FileDrops(self, self.tray.add_files)  # files dropped anywhere on the window
        self.tray.refused.connect(lambda text: self.notices.show_notice(text, "warning"))
        model = self.session.model
        for changed in (
            self.input.textChanged,
            self.tray.changed,
            model.modelReset,
            model.rowsInserted,
            model.rowsRemoved,
            self.session.responseFinished,
        ):
            changed.connect(lambda *_: self.meter.schedule())  # counted again a moment after the last change
        model.modelReset.connect(self.meter.restart)  # another chat: its count, never the last one's
        self.color_toggle.toggled.connect(self._set_color_drafts)
        self.sparkline_toggle.toggled.connect(self._set_sparkline)
        self.chat_settings_button.changed.connect(self.meter.schedule)
        self.session.busyChanged.connect(self._busy_changed)
        self.session.noticeRaised.connect(lambda text, level: self.notices.show_notice(text, level))
        self.session.saveNotice.connect(self._save_notice)
        for shown in (model.modelReset, model.rowsInserted, model.rowsRemoved):
            shown.connect(self._update_empty)

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
        if self.models.skip_model_that_crashed():
            self.models.load_models()

    # --- what the app and the menus ask of the window -------------------------------------------
    @property
    def model_info(self) -> dict | None:
        """The loaded model's info (name, path, backend, n_ctx, method…), None while none is loaded."""
        return self.models.info

    def send_message(self) -> None:
        self.chat.send_message()

    def new_chat(self) -> None:
        self.chat.new_chat()

    def open_conversation(self, conversation_id: int) -> None:
        self.chat.open_conversation(conversation_id)

    def apply_settings(self, new: AppSettings) -> None:
        """Save new settings and apply them: reload the model, or change speculation, as needed."""
        self.models.apply_settings(new)

    def store_settings(self, new: AppSettings) -> None:
        """These settings from now on, and saved (if they cannot be, they last until SpecChat quits)."""
        self.settings = new
        try:
            save_settings(new)
        except OSError as exc:
            self.notices.show_notice(
                f"Settings could not be saved ({exc}); they apply until you quit.", "warning", key="save"
            )

    # --- what the window shows ------------------------------------------------------------------
    def _set_color_drafts(self, on: bool) -> None:
        self.view.set_color_drafts(on)
        self.store_settings(self.settings.merged({"color_drafts": on}))

    def _set_sparkline(self, on: bool) -> None:
        self.view.set_show_sparkline(on)
        self.store_settings(self.settings.merged({"show_sparkline": on}))

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

    def _save_notice(self, text: str, level: str, key: str) -> None:
        """What the store refused (a full disk), or saved after all: one notice per key, the latest word."""
        if text:
            self.notices.show_notice(text, level, key=key)
        else:
            self.notices.clear(key)

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:  # a theme applied: the drawn icon takes its text colour
            self.attach_button.setIcon(paperclip_icon(self.palette().color(QPalette.ColorRole.ButtonText)))

    # --- closing ------------------------------------------------------------------------------
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

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        # An answer the store still refuses is kept for the next start if it can be; only if not, closing asks.
        # (Kept here, it is not written again at the session's close unless it changed there.)
        asked = not self.session.save_unsaved() and self.session.keep_held() is None
        if asked and not self._close_unsaved():
            event.ignore()
            return
        self.tools.close_all()
        self.session.stop()
        # Asked to stop, not waited for: the window closes at once, even while a model loads or a long chat is
        # counted. Their threads are kept until they end, and the app's exit waits for them (app.models.threads).
        self.engine.request_shutdown()
        self.counter.request_shutdown()
        self.files.close()  # an import under way ends its wait (ConversationImport.abandon)
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
        self._save_layout()
        self.chat.list_refresh.stop()
        self.meter.stop()  # a count scheduled by the last events would read the closed store
        self.store.close()
        super().closeEvent(event)

    def _save_layout(self) -> None:
        """The window's geometry and the sidebar's width, for the next start."""
        try:
            self.store_settings(
                self.settings.merged(
                    {
                        "window_geometry": self.saveGeometry().toBase64().toStdString(),
                        "splitter_state": self.splitter.saveState().toBase64().toStdString(),
                    }
                )
            )
        except Exception:  # noqa: BLE001 - closing must never fail
            log.exception("saving the window layout")
