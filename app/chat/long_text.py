"""The whole of a message too long to render in the chat (render.fold_point): plain text in a viewer that takes it
a slice per turn of the event loop, so even 50 MB never holds the window more than a few milliseconds at a time.

Lines longer than LINE are shown broken (Qt's layout of one line grows with the square of its length); Copy all
copies the text exactly as it is."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFontDatabase, QGuiApplication, QTextCursor
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout

SLICE = 32_000  # characters appended per turn (~5-10 ms here)
LINE = 1_000  # characters per shown line


def size_words(chars: int) -> str:
    """ "2,000,000 characters" for a fold button or a title."""
    return f"{chars:,} characters"


def display_lines(text: str) -> str:
    """text with lines over LINE characters broken every LINE characters (for showing only)."""
    out: list[str] = []
    for line in text.split("\n"):
        out.extend(line[i : i + LINE] for i in range(0, max(len(line), 1), LINE))
    return "\n".join(out)


class LongTextViewer(QDialog):
    def __init__(self, text: str, title: str = "The whole message", parent=None):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.resize(800, 600)
        self.text, self._at = text, 0
        column = QVBoxLayout(self)
        self.status = QLabel()
        column.addWidget(self.status)
        self.view = QPlainTextEdit(readOnly=True)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.view.setUndoRedoEnabled(False)
        column.addWidget(self.view, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        copy = QPushButton("Copy all")
        copy.setToolTip("Copy the whole message exactly as it is")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.text))
        buttons.addButton(copy, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        column.addWidget(buttons)
        self._timer = QTimer(self, interval=0)
        self._timer.timeout.connect(self._append_slice)
        self._timer.start()
        self._append_slice()

    @property  # a property, not a method: QDialog.done(int), which Esc calls, stays Qt's own
    def done(self) -> bool:  # type: ignore[override]
        return self._at >= len(self.text)

    def _append_slice(self) -> None:
        piece = self.text[self._at : self._at + SLICE]
        self._at += len(piece)
        cursor = QTextCursor(self.view.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(display_lines(piece))  # a line cut between slices is shown broken there too
        if self.done:
            self._timer.stop()
            self.status.setText(f"{size_words(len(self.text))}; lines over {LINE:,} characters are shown broken.")
        else:
            self.status.setText(f"Showing {size_words(self._at)} of {len(self.text):,}…")
