"""The window's status bar: the model, a passing message, speculation, the server, this chat's engine.

Each segment is an ElidedLabel: it asks for its whole text's width but may shrink to a few characters, eliding
the rest with the whole text in its tooltip, so at any window width the segments share the bar and none overlaps
or runs past its edge (QStatusBar's own message was painted, unelided, under whatever space the permanent
widgets left it). A message replaces the model segment while it shows, as QStatusBar's does.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QFontMetricsF
from PySide6.QtWidgets import QLabel, QProgressBar, QSizePolicy, QStatusBar

MIN_CHARS = 6  # the narrowest a segment goes: a few characters and the ellipsis
GAP = 8  # room between segments (the bar's spacing and the labels' frames), a little more than Qt's


def share(room: int, wanted: list[tuple[int, int]]) -> list[int]:
    """Widths for segments that want (width, weight) within room: those that fit their share get what they want,
    and what they leave is shared again among the rest by weight."""
    widths = [0] * len(wanted)
    left = set(range(len(wanted)))
    while left:
        unit = max(room, 0) / sum(wanted[i][1] for i in left)
        fits = [i for i in left if wanted[i][0] <= unit * wanted[i][1]]
        if not fits:
            for i in left:
                widths[i] = int(unit * wanted[i][1])
            break
        for i in fits:
            widths[i] = wanted[i][0]
            room -= wanted[i][0]
            left.discard(i)
    return widths


def _advance(label: QLabel, text: str) -> int:
    """text's width in label's font, rounded up (the integer metrics round fractional widths down)."""
    return math.ceil(QFontMetricsF(label.font()).horizontalAdvance(text))


class ElidedLabel(QLabel):
    """A one-line label that shows as much of its text as fits, ending in "…"; text() is the whole text, and the
    tooltip holds it whenever it is cut (before any tooltip of the label's own)."""

    def __init__(self, text: str = "", parent=None, elide: Qt.TextElideMode = Qt.TextElideMode.ElideRight):
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self._full, self._tip, self._elide = "", "", elide
        self.changed = lambda: None  # told when the width it wants, or whether it shows, changes
        self.setText(text)

    def text(self) -> str:  # noqa: D102 - the whole text, not what fits
        return self._full

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        self._full = text
        self.updateGeometry()
        self._fit()
        self.changed()

    def setToolTip(self, tip: str) -> None:  # noqa: N802
        self._tip = tip
        self._fit()

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(self._width(self._full), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(
            min(self._width(self._full), self.fontMetrics().averageCharWidth() * MIN_CHARS),
            super().minimumSizeHint().height(),
        )

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fit()

    def setVisible(self, visible: bool) -> None:  # noqa: N802 - show() and hide() come here too
        super().setVisible(visible)
        self.changed()

    def _width(self, text: str) -> int:
        margins = self.contentsMargins()
        return _advance(self, text) + margins.left() + margins.right() + 2 * self.margin() + 2

    def _fit(self) -> None:
        room = self.contentsRect().width() - 2 * self.margin() - 2
        # elidedText cut a text whose fractional width rounded down to exactly the room: measured whole here
        fits = _advance(self, self._full) <= room
        shown = self._full if fits else self.fontMetrics().elidedText(self._full, self._elide, max(room, 0))
        super().setText(shown)
        cut = shown != self._full
        super().setToolTip("\n\n".join(t for t in (self._full if cut else "", self._tip) if t))


class StatusBar(QStatusBar):
    """A status bar whose segments shrink and elide together (see the module's note). showMessage, clearMessage
    and currentMessage work as QStatusBar's do, with the message elided in the model's place."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model_label = ElidedLabel()
        self.message_label = ElidedLabel()
        self.message_label.hide()
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # indeterminate: llama.cpp reports no fraction we could trust
        self.progress.setMaximumWidth(140)
        self.progress.setMinimumWidth(40)
        self.progress.hide()
        self.spec_label = ElidedLabel()
        self.server_label = ElidedLabel(elide=Qt.TextElideMode.ElideMiddle)  # an address: its port is its end
        self.server_label.hide()
        self.engine_label = ElidedLabel()
        self.engine_label.hide()
        self.addWidget(self.model_label, 1)
        self.addWidget(self.message_label, 1)
        for widget in (self.progress, self.spec_label, self.server_label, self.engine_label):
            self.addPermanentWidget(widget)
        self._message = ""
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.clearMessage)
        self._sharing = QTimer(self, singleShot=True, interval=0)  # once per event-loop turn, after every change
        self._sharing.timeout.connect(self._share)
        for label in (self.model_label, self.message_label, self.spec_label, self.server_label, self.engine_label):
            label.changed = self._sharing.start

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._share()

    def _share(self) -> None:
        """Each segment's widest: its whole text where the bar has room, else an even share (the model or the
        message counts twice), what a short segment leaves going to the others. The main segment takes the rest."""
        main = self.message_label if self._message else self.model_label
        labels = [w for w in (main, self.spec_label, self.server_label, self.engine_label) if not w.isHidden()]
        gaps = (len(labels) + 1) * GAP + (self.progress.width() + GAP if not self.progress.isHidden() else 0)
        grip = 20 if self.isSizeGripEnabled() else 0
        widths = share(self.width() - gaps - grip, [(w.sizeHint().width(), 2 if w is main else 1) for w in labels])
        for label, width in zip(labels, widths):
            if label is not main:
                label.setMaximumWidth(max(width, label.minimumSizeHint().width()))

    def segments(self) -> list:
        """The segments showing now, left to right."""
        return [
            w
            for w in (
                self.model_label,
                self.message_label,
                self.progress,
                self.spec_label,
                self.server_label,
                self.engine_label,
            )
            if w.isVisible()
        ]

    def showMessage(self, text: str, timeout: int | None = 0) -> None:  # noqa: N802 - Qt's name
        if not text:
            return self.clearMessage()
        self._message = text
        self.message_label.setText(text)
        self.model_label.hide()
        self.message_label.show()
        self._timer.stop()
        if timeout is not None and timeout > 0:
            self._timer.start(timeout)
        self.messageChanged.emit(text)

    def clearMessage(self) -> None:  # noqa: N802
        self._timer.stop()
        super().clearMessage()  # a status tip QStatusBar showed itself goes too
        if not self._message:
            return
        self._message = ""
        self.message_label.hide()
        self.message_label.setText("")
        self.model_label.show()
        self.messageChanged.emit("")

    def currentMessage(self) -> str:  # noqa: N802
        return self._message or super().currentMessage()
