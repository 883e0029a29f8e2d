"""Text from outside SpecChat (a model's answer, a file, an imported chat, a server) shown without letting it
reach the user's files or open anything unasked.

Qt's rich text loads every image it names, `file://` included, synchronously on the GUI thread (a FIFO blocks the
window for ever, /dev/zero eats memory), and QTextBrowser shows a clicked `file://` link's content. So:
- SafeTextBrowser, the base of every widget that renders Markdown, loads no resource (an image is a placeholder)
  and hands links to open_link;
- open_link opens http(s) and mailto only, after the user has read the whole address;
- install_guards() makes labels plain text unless they say otherwise (Qt guesses "rich" from a leading tag, and
  an error message can start with one) and shows every tooltip as plain text.
"""

from __future__ import annotations

from functools import lru_cache
from typing import cast

from PySide6 import QtGui
from PySide6.QtCore import QEvent, QObject, Qt, QUrl
from PySide6.QtGui import QColor, QDesktopServices, QHelpEvent, QImage, QPainter, QTextDocument
from PySide6.QtWidgets import QAbstractItemView, QApplication, QLabel, QMessageBox, QTextBrowser, QToolTip, QWidget

LINK_SCHEMES = ("http", "https", "mailto")
RICH_TOOLTIP = "richToolTip"  # a widget property: its tooltip is SpecChat's own rich text


@lru_cache(maxsize=1)
def placeholder_image() -> QImage:
    """What an image in rendered text shows instead of its file: a small grey box."""
    image = QImage(16, 12, QImage.Format.Format_ARGB32)
    image.fill(QColor(127, 127, 127, 60))
    painter = QPainter(image)
    painter.setPen(QColor(127, 127, 127, 200))
    painter.drawRect(0, 0, 15, 11)
    painter.end()
    return image


class SafeTextBrowser(QTextBrowser):
    """A read-only text browser that never loads what its text names and opens links only through open_link."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)  # a clicked link would otherwise replace the text with the linked file
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(lambda url: open_link(url, self))

    def loadResource(self, kind: int, url: QUrl | str):  # noqa: N802 - Qt's name
        # Never None: a null answer makes QTextDocument read the file itself.
        if kind == QTextDocument.ResourceType.ImageResource.value:
            return placeholder_image()
        return ""


def open_link(url: QUrl, parent: QWidget | None) -> bool:
    """Open a link from rendered text in the system's handler: http(s) and mailto only, once the user has seen
    the whole address and agreed. Returns whether it was opened."""
    address = url.toString(QUrl.ComponentFormattingOption.FullyEncoded)  # punycode: no look-alike host names
    if url.scheme().lower() not in LINK_SCHEMES or not url.isValid():
        message(
            parent,
            QMessageBox.Icon.Information,
            "Link not opened",
            f"SpecChat opens only web and e-mail links (http, https, mailto). This one was not opened:\n\n{address}",
        )
        return False
    box = _box(parent, QMessageBox.Icon.Question, "Open link", f"Open this address in your browser?\n\n{address}")
    box.setStandardButtons(QMessageBox.StandardButton.Open | QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    if box.exec() != QMessageBox.StandardButton.Open:
        return False
    return QDesktopServices.openUrl(url)


def message(parent: QWidget | None, icon: QMessageBox.Icon, title: str, text: str) -> None:
    """A message box whose text is shown as typed, whatever it holds (an error from a server, a file name)."""
    _box(parent, icon, title, text).exec()


def _box(parent, icon, title: str, text: str) -> QMessageBox:
    box = QMessageBox(icon, title, text, QMessageBox.StandardButton.Ok, parent)
    box.setTextFormat(Qt.TextFormat.PlainText)
    return box


class _PlainByDefault(QObject):
    """Labels become plain text when first shown unless SpecChat set their format; every tooltip is shown as
    plain text unless its widget has the RICH_TOOLTIP property."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        kind = event.type()
        if (
            kind == QEvent.Type.Polish
            and isinstance(watched, QLabel)
            and watched.textFormat() == Qt.TextFormat.AutoText
        ):
            watched.setTextFormat(Qt.TextFormat.PlainText)
        elif kind == QEvent.Type.ToolTip and isinstance(watched, QWidget):
            help_event = cast(QHelpEvent, event)  # a ToolTip event is a QHelpEvent
            text = _tooltip_at(watched, help_event.pos())
            if text and QtGui.Qt.mightBeRichText(text) and not watched.property(RICH_TOOLTIP):
                QToolTip.showText(help_event.globalPos(), QtGui.Qt.convertFromPlainText(text), watched)
                return True
        return False


def _tooltip_at(widget: QWidget, pos) -> str:
    view = widget.parent()
    if isinstance(view, QAbstractItemView) and widget is view.viewport():  # a table's or list's cell
        return str(view.indexAt(pos).data(Qt.ItemDataRole.ToolTipRole) or "")
    return widget.toolTip()


_guard: _PlainByDefault | None = None


def install_guards() -> None:
    """Once per application: plain labels and tooltips by default (see _PlainByDefault)."""
    global _guard
    app = QApplication.instance()
    if app is not None and _guard is None:
        _guard = _PlainByDefault(app)
        app.installEventFilter(_guard)
