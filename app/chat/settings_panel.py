"""This chat's system prompt, sampling and engine: the Preset button under the conversation, and the dialog it
opens, where the user picks a preset, changes its values for this chat only, and manages presets.

Preset changes (save, save as new, rename, delete, make default) are written to presets.json at once;
the chat's own choice is kept when the dialog is accepted.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from app.chat.engine_picker import EnginePicker
from app.chat.session import ChatSession
from app.settings.dialog import double_spin_box, form, hint, spin_box
from app.settings.presets import Preset, check_values
from engine.errors import InvalidSettingError

LABELS = {
    "system_prompt": "System prompt",
    "temperature": "Temperature",
    "top_k": "Top-k",
    "top_p": "Top-p",
    "min_p": "Min-p",
    "seed": "Seed",
    "max_tokens": "Max response tokens",
    "engine_url": "Engine",
    "engine_model": "Remote model",
}


def preset_summary(session: ChatSession) -> tuple[str, str]:
    """The button's text and tooltip: the open chat's preset, and what the chat changes of it."""
    book, conversation = session.presets(), session.conversation_settings()
    name, changed = book.base_of(conversation).name, book.overrides(conversation)
    remote = session.remote_endpoint()
    text = f"Preset: {name}" + (" (changed)" if changed else "") + (f" · {remote.host}" if remote else "")
    tip = (
        f"This chat uses the preset “{name}”"
        + (f", with its own {', '.join(LABELS[k].lower() for k in changed)}" if changed else "")
        + (f", answered by the server at {remote.url}" if remote else "")
        + ". Click to pick another preset or change its values for this chat."
    )
    return text, tip


class ChatSettingsButton(QPushButton):
    """Shows the open chat's preset; opens its settings."""

    changed = Signal()  # the dialog closed: the chat's settings may differ (the context meter counts again)
    refreshed = Signal()  # shows the open chat's settings (another chat opened, or they changed)

    def __init__(self, session: ChatSession, parent=None):
        super().__init__(parent)
        self.session = session
        self.dialog: ChatSettingsDialog | None = None
        self.clicked.connect(self.open_dialog)
        self.refresh()

    def refresh(self) -> None:
        text, tip = preset_summary(self.session)
        self.setText(text)
        self.setToolTip(tip)
        self.refreshed.emit()

    def open_dialog(self) -> ChatSettingsDialog:
        self.dialog = ChatSettingsDialog(self.session, self.window())
        self.dialog.finished.connect(self._closed)
        self.dialog.open()  # window-modal, and the event loop goes on (a response may be streaming)
        return self.dialog

    def _closed(self, _result: int) -> None:
        self.refresh()
        self.changed.emit()
        if self.dialog is not None:
            self.dialog.deleteLater()
            self.dialog = None


class ChatSettingsDialog(QDialog):
    def __init__(self, session: ChatSession, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.session = session
        self.book = session.presets()  # the window's own: changes here are the app's
        conversation = session.conversation_settings()
        self._make_preset_buttons()
        self._make_fields()
        self._lay_out()
        self.resize(560, 760)
        self._fill_presets(self.book.base_of(conversation).name)
        self.show_values(self.book.effective(conversation))
        self._connect()

    def _make_preset_buttons(self) -> None:
        self.preset = QComboBox()
        self.preset.setToolTip("The preset this chat follows. Picking one shows its values.")
        self.make_default = QPushButton("Make default")
        self.make_default.setToolTip("New chats start from the default preset.")
        self.save_to = QPushButton("Save to preset")
        self.save_to.setToolTip("Store the values below in this preset: every chat that follows it uses them.")
        self.save_new = QPushButton("Save as new…")
        self.rename = QPushButton("Rename…")
        self.delete = QPushButton("Delete…")
        self.delete.setToolTip("Chats that follow a deleted preset follow the default one.")

    def _make_fields(self) -> None:
        """The values this chat uses (self.fields, by their settings names), its engine, and the lines under them."""
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("Optional instructions the model sees before the conversation")
        self.system_prompt.setMinimumHeight(90)
        self.temperature = double_spin_box(0.0, 5.0, 0.05, 2, "0 always picks the most likely token.")
        self.top_k = spin_box(0, 100000, "0 turns top-k off.")
        self.top_p = double_spin_box(0.01, 1.0, 0.01, 2, "1.00 turns top-p off.")
        self.min_p = double_spin_box(0.0, 0.99, 0.01, 2, "0.00 turns min-p off.")
        self.seed = QLineEdit()
        self.seed.setPlaceholderText("random")
        self.seed.setToolTip("A whole number makes sampling repeatable; empty picks a new seed each time.")
        self.max_tokens = spin_box(1, 131072, "The longest response, in tokens.")
        self.fields: dict[str, QPlainTextEdit | QLineEdit | QSpinBox | QDoubleSpinBox] = {
            "system_prompt": self.system_prompt,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
        }
        self.engine_picker = picker = EnginePicker(self)
        # The picker's fields under the dialog's own names, as callers and tests use them.
        self.engine, self.engine_url, self.engine_model, self.list_models, self.api_key, self.engine_note = (
            picker.engine,
            picker.url,
            picker.model,
            picker.list_models,
            picker.api_key,
            picker.note,
        )

        self.changes = hint("")
        self.reset = QPushButton("Use the preset's values")
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c62828;")
        self.error.hide()

    def _lay_out(self) -> None:
        picker = QHBoxLayout()
        picker.addWidget(self.preset, 1)
        picker.addWidget(self.make_default)
        manage = QGridLayout()
        for i, button in enumerate((self.save_to, self.save_new, self.rename, self.delete)):
            manage.addWidget(button, i // 2, i % 2)
        self.form = form()
        self.form.addRow("Preset", picker)
        self.form.addRow("", manage)
        for key, widget in self.fields.items():
            self.form.addRow(LABELS[key], widget)
        changed_row = QHBoxLayout()
        changed_row.addWidget(self.changes, 1)
        changed_row.addWidget(self.reset)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(self.form)
        layout.addWidget(self.engine_picker)
        layout.addLayout(changed_row)
        layout.addWidget(hint("These apply to this chat's next responses. Preset buttons save the presets at once."))
        layout.addWidget(self.error)
        layout.addStretch(1)
        layout.addWidget(self.buttons)

    def _connect(self) -> None:
        self.preset.activated.connect(lambda _i: self.show_values(self.current_preset()))
        self.make_default.clicked.connect(self.make_current_default)
        self.save_to.clicked.connect(self.save_to_preset)
        self.save_new.clicked.connect(self.save_as_new)
        self.rename.clicked.connect(self.rename_preset)
        self.delete.clicked.connect(lambda: self.delete_preset())  # not clicked's bool as confirm
        self.reset.clicked.connect(lambda: self.show_values(self.current_preset()))
        for widget in self.fields.values():
            signal = widget.textChanged if isinstance(widget, (QLineEdit, QPlainTextEdit)) else widget.valueChanged
            signal.connect(self._update_changes)
        self.engine_picker.changed.connect(self._update_changes)

    # --- what is shown ------------------------------------------------------------------------
    def current_preset(self) -> Preset:
        return self.book.get(self.preset.currentData()) or self.book.default_preset

    def _fill_presets(self, selected: str) -> None:
        self.preset.clear()
        for name in self.book.names():
            self.preset.addItem(f"{name} (default)" if name == self.book.default else name, name)
        self.preset.setCurrentIndex(max(self.preset.findData(selected), 0))
        self.delete.setEnabled(len(self.book.names()) > 1)
        self.make_default.setEnabled(self.preset.currentData() != self.book.default)

    def show_values(self, preset: Preset) -> None:
        self.system_prompt.setPlainText(preset.system_prompt)
        self.temperature.setValue(preset.temperature)
        self.top_k.setValue(preset.top_k)
        self.top_p.setValue(preset.top_p)
        self.min_p.setValue(preset.min_p)
        self.seed.setText("" if preset.seed is None else str(preset.seed))
        self.max_tokens.setValue(preset.max_tokens)
        self.engine_picker.show_values(preset.engine_url, preset.engine_model)
        self.make_default.setEnabled(self.preset.currentData() != self.book.default)
        self._update_changes()

    def values(self) -> dict:
        """The values shown; raises InvalidSettingError with a message for a person."""
        seed_text = self.seed.text().strip()
        try:
            seed = int(seed_text) if seed_text else None
        except ValueError:
            raise InvalidSettingError(f"The seed must be a whole number or empty, not “{seed_text}”.") from None
        values = {
            "system_prompt": self.system_prompt.toPlainText(),
            "temperature": round(self.temperature.value(), 4),
            "top_k": self.top_k.value(),
            "top_p": round(self.top_p.value(), 4),
            "min_p": round(self.min_p.value(), 4),
            "seed": seed,
            "max_tokens": self.max_tokens.value(),
            **self.engine_picker.values(),
        }
        check_values(values)
        return values

    def overrides(self) -> dict:
        """The values shown that differ from the preset's (as the fields would show the preset's)."""
        preset = self.current_preset()
        shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in preset.values().items()}
        return {k: v for k, v in self.values().items() if v != shown[k]}

    def _update_changes(self) -> None:
        try:
            changed = self.overrides()
        except InvalidSettingError as exc:
            self.changes.setText(str(exc))
            return
        bold = QFont(self.font())
        bold.setBold(True)
        for key, widget in self.fields.items():
            label = self.form.labelForField(widget)
            if label is not None:
                label.setFont(bold if key in changed else self.font())
        self.changes.setText(
            f"Changed for this chat: {', '.join(LABELS[k].lower() for k in changed)}."
            if changed
            else f"This chat uses “{self.current_preset().name}” as saved."
        )
        self.reset.setEnabled(bool(changed))

    # --- presets ------------------------------------------------------------------------------
    def _saved(self, selected: str) -> None:
        """The book changed: write it, and show it."""
        self._fill_presets(selected)
        self._update_changes()
        try:
            self.book.save()
            self.error.hide()
        except OSError as exc:
            self._show_error(f"The presets could not be saved ({exc}); the change applies until you quit.")

    def _show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.show()

    def _ask_name(self, title: str, suggestion: str) -> str | None:
        name, ok = QInputDialog.getText(self, title, "Preset name:", QLineEdit.EchoMode.Normal, suggestion)
        return name.strip() if ok and name.strip() else None

    def save_to_preset(self) -> None:
        try:
            self.book.put(self.current_preset().with_values(self.values()))
        except InvalidSettingError as exc:
            return self._show_error(str(exc))
        self._saved(self.current_preset().name)

    def save_as_new(self) -> None:
        name = self._ask_name("Save as a new preset", f"{self.current_preset().name} copy")
        if name is None:
            return
        try:
            self.book.put(Preset(name).with_values(self.values()))
        except InvalidSettingError as exc:
            return self._show_error(str(exc))
        self._saved(name)

    def rename_preset(self) -> None:
        old = self.current_preset().name
        new = self._ask_name("Rename preset", old)
        if new is None or new == old:
            return
        try:
            self.book.rename(old, new)
        except InvalidSettingError as exc:
            return self._show_error(str(exc))
        self._follow_rename(old, new)
        self._saved(new)

    def _follow_rename(self, old: str, new: str) -> None:
        """Chats that follow the preset keep following it under its new name."""
        store = self.session.store
        for conversation in store.conversations():
            values = store.conversation_settings(conversation.id)
            if values.get("preset") == old:
                store.set_conversation_settings(conversation.id, {**values, "preset": new})
        if self.session.new_chat_settings.get("preset") == old:
            self.session.new_chat_settings["preset"] = new

    def delete_preset(self, confirm: bool = True) -> None:
        name = self.current_preset().name
        if (
            confirm
            and QMessageBox.question(
                self,
                "Delete preset",
                f"Delete the preset “{name}”? Chats that follow it will follow the default preset instead.",
            )
            != QMessageBox.StandardButton.Yes
        ):
            return
        try:
            self.book.delete(name)
        except InvalidSettingError as exc:
            return self._show_error(str(exc))
        self._saved(self.book.default)
        self.show_values(self.current_preset())

    def make_current_default(self) -> None:
        self.book.set_default(self.current_preset().name)
        self._saved(self.current_preset().name)

    # --- this chat ----------------------------------------------------------------------------
    def accept(self) -> None:
        try:
            changes = self.overrides()
        except InvalidSettingError as exc:
            return self._show_error(str(exc))
        self.session.set_conversation_settings({"preset": self.current_preset().name, **changes})
        session = self.session  # outlives this dialog: told if the key cannot be saved
        self.engine_picker.keep_api_key(lambda text: session.noticeRaised.emit(text, "warning"), owner=session)
        super().accept()
