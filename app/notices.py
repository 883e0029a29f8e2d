"""Banners at the top of the chat: information, warnings and errors the user should see, each
with a close button. Nothing here is ever only printed to a console."""

from __future__ import annotations

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from app.safe_text import open_link

STYLES = {
    "info": "background: rgba(33, 150, 243, 0.13); border: 1px solid rgba(33, 150, 243, 0.45);",
    "warning": "background: rgba(255, 167, 38, 0.16); border: 1px solid rgba(255, 167, 38, 0.6);",
    "error": "background: rgba(229, 57, 53, 0.14); border: 1px solid rgba(229, 57, 53, 0.6);",
}


def inert_markdown(text: str) -> str:
    """A notice's Markdown with its images and HTML shown as text: a notice quotes errors and names from outside
    (a server's message, a file's model name), and a QLabel loads the images its rich text names from disk."""
    return text.replace("<", "&lt;").replace("![", "!\\[")


class Notice(QFrame):
    closed = Signal()

    def __init__(self, text: str, level: str = "info", key: str = "", parent=None):
        super().__init__(parent)
        self.key, self.level = key, level
        self.setObjectName("notice")
        self.setStyleSheet(f"#notice {{ {STYLES[level]} border-radius: 4px; }}")
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 6, 6)
        self.text = text
        self.label = QLabel(inert_markdown(text))
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.MarkdownText)
        self.label.linkActivated.connect(lambda link: open_link(QUrl(link), self))
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        row.addWidget(self.label, 1)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        close.clicked.connect(self.dismiss)
        row.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)

    def dismiss(self) -> None:
        self.hide()
        self.closed.emit()
        self.deleteLater()


class NoticeArea(QWidget):
    """A column of notices. A notice with a key replaces an earlier one with the same key."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(12, 6, 12, 0)
        self.column.setSpacing(4)
        self.notices: list[Notice] = []
        self.setVisible(False)

    def show_notice(self, text: str, level: str = "info", key: str = "") -> Notice:
        if key:
            self.clear(key)
        for shown in self.notices:
            if shown.text == text and shown.level == level:
                return shown  # the same message again (e.g. trimming on every turn): once is enough
        notice = Notice(text, level, key)
        notice.closed.connect(lambda n=notice: self._forget(n))
        self.notices.append(notice)
        self.column.addWidget(notice)
        self.setVisible(True)
        return notice

    def clear(self, key: str) -> None:
        for n in [n for n in self.notices if n.key == key]:
            n.dismiss()

    def texts(self) -> list[str]:
        return [n.text for n in self.notices]

    def shown_texts(self) -> list[str]:
        return [n.text for n in self.notices if not n.isHidden()]

    def set_hidden(self, key: str, hidden: bool) -> None:
        """Hide the notices with this key, or show them again, keeping them: for a notice that is not true of
        the chat open now (the demo model's, in a chat a server answers)."""
        for n in self.notices:
            if n.key == key:
                n.setHidden(hidden)
        self._show_if_any()

    def _forget(self, notice: Notice) -> None:
        if notice in self.notices:
            self.notices.remove(notice)
        self._show_if_any()

    def _show_if_any(self) -> None:
        self.setVisible(any(not n.isHidden() for n in self.notices))
