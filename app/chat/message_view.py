"""The message list: a view over ChatModel that shows each message as rendered markdown with its
actions and, for responses, the live stats line.

Each message is a column of rendered chunks (see message_text.py), so streaming stays cheap. Only
the newest PAGE messages get widgets at first ("Show earlier messages" adds more), so a long
conversation opens fast and scrolls smoothly.
"""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QScrollArea, QToolButton, QVBoxLayout, QWidget

from app.chat.message_text import ResponseText, UserText
from app.chat.model import ChatModel, continuable, span_source
from app.chat.render import DRAFT_COLOR, DRAFT_MODEL_COLOR, MTP_COLOR
from app.chat.stats_view import StatsBar
from app.conversations.store import Message
from engine.methods import method_words
from engine.reasoning import without_thinking

PAGE = 24
STATUS_TEXT = {
    "streaming": "writing…",
    "stopped": "stopped",
    "error": "failed",
    "interrupted": "interrupted: the app closed while this was being written",
}


class BranchSwitcher(QWidget):
    """‹ 2 / 3 ›: which of a message's versions (regenerated answers, edited questions) is shown."""

    stepped = Signal(int)  # -1: the one before, +1: the one after

    def __init__(self, parent=None):
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        self.previous = QToolButton(text="‹", toolTip="Show the previous version", autoRaise=True)
        self.position = QLabel()
        self.next = QToolButton(text="›", toolTip="Show the next version", autoRaise=True)
        self.previous.clicked.connect(lambda: self.stepped.emit(-1))
        self.next.clicked.connect(lambda: self.stepped.emit(1))
        for w in (self.previous, self.position, self.next):
            row.addWidget(w)

    def set_position(self, position: int, count: int) -> None:
        self.position.setText(f"{position} / {count}")
        self.previous.setEnabled(position > 1)
        self.next.setEnabled(position < count)
        self.setVisible(count > 1)


# What each shade means, in the legend under an answer: (key, colour, words).
LEGEND = (
    ("lookup", DRAFT_COLOR, "from prompt lookup"),
    ("draft", DRAFT_MODEL_COLOR, "from the draft model"),
    ("mtp", MTP_COLOR, f"from the {method_words('name')['mtp']}"),
    ("eagle3", DRAFT_MODEL_COLOR, "from the EAGLE-3 draft head"),
    (None, DRAFT_COLOR, "from accepted drafts (proposer not recorded)"),
)


class ShadingLegend(QWidget):
    """Under an answer while shading is on: a swatch and its words for each proposer whose drafts it shows."""

    def __init__(self, parent=None):
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(4)
        self.entries: dict[str | None, tuple[QLabel, QLabel]] = {}
        for key, color, words in LEGEND:
            swatch = QLabel()
            swatch.setFixedSize(12, 12)
            swatch.setStyleSheet(
                f"background: rgba({color.red()}, {color.green()}, {color.blue()}, "
                f"{color.alpha()}); border: 1px solid rgba(127, 127, 127, 120);"
            )
            label = QLabel(words)
            label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
            font = label.font()
            font.setPointSizeF(font.pointSizeF() * 0.88)
            label.setFont(font)
            row.addWidget(swatch)
            row.addWidget(label)
            row.addSpacing(8)
            self.entries[key] = (swatch, label)
        row.addStretch(1)

    def set_sources(self, sources: set) -> None:
        for key, (swatch, label) in self.entries.items():
            swatch.setVisible(key in sources)
            label.setVisible(key in sources)

    def shown(self) -> list[str]:
        """The words of the entries shown."""
        return [label.text() for swatch, label in self.entries.values() if not label.isHidden()]


class MessageWidget(QFrame):
    editRequested = Signal(object)  # Message
    regenerateRequested = Signal(object)
    continueRequested = Signal(object)
    branchRequested = Signal(object, int)  # Message, step to the sibling shown instead

    def __init__(self, message: Message, parent=None):
        super().__init__(parent)
        self.message = message
        self.setObjectName("userMessage" if message.role == "user" else "assistantMessage")
        self.setFrameShape(QFrame.Shape.StyledPanel if message.role == "user" else QFrame.Shape.NoFrame)
        if message.role == "user":
            self.setAutoFillBackground(True)
            self.setBackgroundRole(QPalette.ColorRole.AlternateBase)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)

        header = QHBoxLayout()
        self.who = QLabel()
        font = self.who.font()
        font.setBold(True)
        self.who.setFont(font)
        self.status = QLabel()
        self.status.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        header.addWidget(self.who)
        header.addWidget(self.status)
        header.addStretch(1)
        self.branches = BranchSwitcher()
        self.branches.stepped.connect(lambda step: self.branchRequested.emit(self.message, step))
        self.branches.hide()
        header.addWidget(self.branches)
        self.copy_button = self._tool("Copy", "Copy this message as markdown", self._copy)
        self.edit_button = self._tool(
            "Edit", "Edit this message and send it again", lambda: self.editRequested.emit(self.message)
        )
        self.regenerate_button = self._tool(
            "Regenerate", "Write this response again", lambda: self.regenerateRequested.emit(self.message)
        )
        self.continue_button = self._tool(
            "Continue", "Write more of this answer", lambda: self.continueRequested.emit(self.message)
        )
        for b in (self.edit_button, self.regenerate_button, self.continue_button, self.copy_button):
            header.addWidget(b)
        layout.addLayout(header)

        self.text = ResponseText() if message.role == "assistant" else UserText()  # see message_text.py
        layout.addWidget(self.text)
        self.notice = QLabel()
        self.notice.setWordWrap(True)
        self.notice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.notice)
        self.legend = ShadingLegend() if message.role == "assistant" else None
        if self.legend:
            self.legend.hide()
            layout.addWidget(self.legend)
        self.stats = StatsBar() if message.role == "assistant" else None
        if self.stats:
            layout.addWidget(self.stats)
        self.edit_button.hide()
        self.regenerate_button.hide()
        self.continue_button.hide()

    def _tool(self, text: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(without_thinking(self.message.content).strip())  # not the thought

    def refresh(self, color_drafts: bool, show_sparkline: bool) -> None:
        m = self.message
        self.who.setText("You" if m.role == "user" else (m.model or "Assistant"))
        self.status.setText(STATUS_TEXT.get(m.status, ""))
        self.text.set_message(m, color_drafts)  # the user's words as typed; responses as markdown
        self.notice.setText(m.notice)
        self.notice.setVisible(bool(m.notice))
        error = m.status == "error"
        self.notice.setStyleSheet("color: #c62828;" if error else "")
        if self.legend:
            sources = {span_source(s) for s in m.draft_spans or []}
            if (m.stats or {}).get("method") == "auto":  # both proposers may draft: both shades are explained
                sources |= {"lookup", "draft"}
            self.legend.set_sources(sources)
            self.legend.setVisible(color_drafts and bool(sources))
        if self.stats:
            self.stats.set_stats(m.stats, show_sparkline)
            self.stats.setVisible(bool(m.stats))


class ChatView(QScrollArea):
    editRequested = Signal(object)  # Message
    regenerateRequested = Signal(object)
    continueRequested = Signal(object)
    branchRequested = Signal(object, int)  # Message, step

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)  # no width flip-flop while growing
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QFrame.Shape.NoFrame)
        body = QWidget()
        self.column = QVBoxLayout(body)
        self.column.setContentsMargins(12, 8, 12, 8)
        self.column.setSpacing(10)
        self.more_button = QPushButton("Show earlier messages")
        self.more_button.clicked.connect(self.show_earlier)
        self.column.addWidget(self.more_button, 0, Qt.AlignmentFlag.AlignHCenter)
        self.column.addStretch(1)
        self.setWidget(body)
        self._warm_up()
        self.model: ChatModel | None = None
        self.widgets: list[MessageWidget] = []  # for rows first_row..
        self.first_row = 0
        self.color_drafts = False
        self.show_sparkline = True
        self.busy = False
        self._stick = True  # follow the newest text while the user is at the bottom
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(lambda v: setattr(self, "_stick", v >= bar.maximum() - 40))
        bar.rangeChanged.connect(self._follow)

    @staticmethod
    def _warm_up() -> None:
        """The first message widget costs tens of ms (PySide creates its enum types, Qt its text
        layout caches); pay that while the window is built, not when the first answer streams."""
        warm = MessageWidget(Message(None, "assistant", "*warm-up* `x`\n\n```\ny\n```", stats={"tokens_per_s": 1.0}))
        warm.refresh(True, True)
        warm.deleteLater()

    def setModel(self, model: ChatModel) -> None:
        self.model = model
        model.modelReset.connect(self._reset)
        model.rowsInserted.connect(self._inserted)
        model.rowsRemoved.connect(self._removed)
        model.dataChanged.connect(self._changed)
        self._reset()

    # --- model → widgets ----------------------------------------------------------------------
    def _reset(self) -> None:
        for w in self.widgets:
            w.hide()
            w.deleteLater()
        self.widgets = []
        assert self.model is not None  # the model's signals call these: it is set
        n = self.model.rowCount()
        self.first_row = max(0, n - PAGE)
        for row in range(self.first_row, n):
            self._add_widget(row)
        self._after_change()
        self._stick = True
        QTimer.singleShot(0, self.scroll_to_bottom)

    def _inserted(self, _parent: QModelIndex, first: int, last: int) -> None:
        for row in range(first, last + 1):
            self._add_widget(row)
        self._after_change()
        self._stick = True

    def _removed(self, _parent: QModelIndex, first: int, last: int) -> None:
        lo, hi = max(first - self.first_row, 0), last - self.first_row + 1
        for w in self.widgets[lo:hi]:
            w.hide()
            w.deleteLater()
        del self.widgets[lo:hi]
        assert self.model is not None
        self.first_row = min(self.first_row, self.model.rowCount())
        self._after_change()

    def _changed(self, top: QModelIndex, bottom: QModelIndex, _roles: object = ()) -> None:
        assert self.model is not None
        for row in range(top.row(), bottom.row() + 1):
            w = self.widget_for(row)
            if w is not None:
                w.refresh(self.color_drafts, self.show_sparkline)
                w.branches.set_position(*self.model.branch(row))
        if not self.busy:
            self._update_actions()  # a status change can make an answer one to continue

    def _add_widget(self, row: int) -> None:
        assert self.model is not None
        message = self.model.message(row)
        w = MessageWidget(message)
        w.editRequested.connect(self.editRequested)
        w.regenerateRequested.connect(self.regenerateRequested)
        w.continueRequested.connect(self.continueRequested)
        w.branchRequested.connect(self.branchRequested)
        w.branches.set_position(*self.model.branch(row))
        index = row - self.first_row
        self.widgets.insert(index, w)
        self.column.insertWidget(1 + index, w)  # after the "earlier" button
        w.refresh(self.color_drafts, self.show_sparkline)

    def show_earlier(self) -> None:
        bar = self.verticalScrollBar()
        from_bottom = bar.maximum() - bar.value()
        new_first = max(0, self.first_row - PAGE)
        for row in range(self.first_row - 1, new_first - 1, -1):
            self.first_row = row
            self._add_widget(row)
        self._after_change()
        QTimer.singleShot(0, lambda: bar.setValue(bar.maximum() - from_bottom))  # keep the reading place

    def _after_change(self) -> None:
        self.more_button.setVisible(self.first_row > 0)
        self._update_actions()

    def _update_actions(self) -> None:
        # Any question can be edited and any answer written again: each makes a branch, the old one stays.
        last = (self.model.rowCount() if self.model else 0) - 1
        for offset, w in enumerate(self.widgets):
            m = w.message
            w.edit_button.setVisible(not self.busy and m.role == "user")
            w.regenerate_button.setVisible(not self.busy and m.role == "assistant" and m.parent_id is not None)
            w.continue_button.setVisible(not self.busy and self.first_row + offset == last and continuable(m))

    # --- options ------------------------------------------------------------------------------
    def widget_for(self, row: int) -> MessageWidget | None:
        i = row - self.first_row
        return self.widgets[i] if 0 <= i < len(self.widgets) else None

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._update_actions()

    def set_color_drafts(self, on: bool) -> None:
        self.color_drafts = on
        self._refresh_all()

    def set_show_sparkline(self, on: bool) -> None:
        self.show_sparkline = on
        self._refresh_all()

    def _refresh_all(self) -> None:
        for w in self.widgets:
            w.refresh(self.color_drafts, self.show_sparkline)

    def scroll_to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _follow(self, _lo: int, hi: int) -> None:
        if self._stick:
            self.verticalScrollBar().setValue(hi)
