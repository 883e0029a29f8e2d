"""Before an imported conversation's settings are used: what it says about where its messages would go and what
would be sent with them, shown in full as the file gives it, with "Import without them" as the default.
(A conversation file is data, never settings: app/conversations/files.py drops them unless the person says so.)"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from engine.text_rules import shown_plainly

WHAT = {
    "engine_url": "Engine: the server your messages, with the whole conversation, would be sent to",
    "engine_model": "The model on that server",
    "system_prompt": "System prompt: sent before every message, not shown in the chat",
    "preset": "Preset: one of this machine's presets, by name, with its engine and system prompt",
}


def settings_text(carried: dict) -> str:
    """Each setting under what it does, its value in full; invisible characters shown by their code."""
    return "\n\n".join(f"{WHAT.get(key, key)}:\n{shown_plainly(value)}" for key, value in carried.items())


class ImportedSettingsDialog(QDialog):
    """Accepted: use the settings ("Use these settings"); rejected, closed or Escape: import without them."""

    def __init__(self, file_name: str, carried: dict, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings in the imported conversation")
        key_note = (
            " If you saved an API key for that server, it would be sent to it." if "engine_url" in carried else ""
        )
        intro = QLabel(
            f"{file_name} holds settings that decide where this chat's next messages go and what is "
            f"sent with them.{key_note} Use them only if you know where the file came from. Without "
            "them the chat is answered as a new chat is (this machine's default preset); its sampling "
            "values (temperature and the like) are kept either way."
        )
        intro.setTextFormat(Qt.TextFormat.PlainText)  # the file name is the file's, not markup
        intro.setWordWrap(True)
        self.details = QPlainTextEdit(settings_text(carried))  # scrolls: a long system prompt is shown in full
        self.details.setReadOnly(True)
        self.details.setMinimumHeight(160)
        self.use = QPushButton("Use these settings")
        self.use.setAutoDefault(False)
        self.without = QPushButton("Import without them")
        self.without.setDefault(True)  # Enter, like Escape, keeps the chat on this machine's settings
        self.use.clicked.connect(self.accept)
        self.without.clicked.connect(self.reject)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.use)
        buttons.addWidget(self.without)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.details, 1)
        layout.addLayout(buttons)
        self.resize(560, 420)
        self.without.setFocus()


def use_imported_settings(parent: QWidget, file_name: str, carried: dict) -> bool:
    """Ask; True only when the person chose "Use these settings"."""
    dialog = ImportedSettingsDialog(file_name, carried, parent)
    try:
        return dialog.exec() == QDialog.DialogCode.Accepted
    finally:
        dialog.deleteLater()
