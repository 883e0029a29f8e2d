"""The message box: Enter sends, Shift+Enter starts a new line, Escape cancels an edit; files dropped
on it are handed on to be attached (see attachments.py), not pasted in as their paths."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QPlainTextEdit

from app.chat.attachments import local_files


class ChatInput(QPlainTextEdit):
    sendRequested = Signal()
    cancelRequested = Signal()
    filesDropped = Signal(list)  # local paths

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setPlaceholderText("Message the model…  (Enter sends, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.document().contentsChanged.connect(self._fit)
        self._fit()

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = event.modifiers()
            if mods & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")
                return
            if not mods & (Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier):
                self.sendRequested.emit()
                return
        if event.key() == Qt.Key.Key_Escape:
            self.cancelRequested.emit()
            return
        super().keyPressEvent(event)

    def dragEnterEvent(self, event) -> None:
        if local_files(event.mimeData()):
            event.acceptProposedAction()
        else:
            super().dragEnterEvent(event)

    def dragMoveEvent(self, event) -> None:
        if local_files(event.mimeData()):
            event.acceptProposedAction()
        else:
            super().dragMoveEvent(event)

    def dropEvent(self, event) -> None:
        files = local_files(event.mimeData())
        if files:
            event.acceptProposedAction()
            self.filesDropped.emit(files)
        else:
            super().dropEvent(event)

    def _fit(self) -> None:
        """Grow with the text, from one line up to about eight."""
        line = self.fontMetrics().lineSpacing()
        lines = min(max(int(self.document().size().height()), 1), 8)
        margins = self.contentsMargins()
        self.setFixedHeight(
            lines * line + int(self.document().documentMargin() * 2) + margins.top() + margins.bottom() + 4
        )
