"""A message's text as widgets: rendered markdown in chunks, code blocks with syntax colours and a Copy
button, a reasoning model's thought folded away, and a user message's attached files as chips.

The message widget (message_view.py) holds one ResponseText or UserText and its own header and actions;
everything about how the text itself is shown is here.
"""

from __future__ import annotations

from bisect import bisect_left
from functools import partial

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.chat.attachments import AttachmentRow, split_attachments
from app.chat.long_text import LongTextViewer, size_words
from app.chat.render import (
    CodeFence,
    append_code,
    apply_colours,
    code_fence,
    colour_ranges,
    fold_point,
    lex_in_background,
    render,
    render_code,
    spans_within,
    split_blocks,
)
from app.conversations.store import Message
from app.safe_text import SafeTextBrowser
from engine.reasoning import find_thinking
from engine.text_rules import BIDI_CONTROLS, SHOWN_WIDTH, bidi_shown


class MessageText(SafeTextBrowser):
    """Read-only rendered markdown that is exactly as tall as its text; the outer view scrolls. It loads nothing
    its text names, and opens links only as open_link allows (safe_text.py)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        palette = self.palette()  # see-through, so the message's own background shows (a palette is far
        palette.setColor(QPalette.ColorRole.Base, Qt.GlobalColor.transparent)  # cheaper than a stylesheet)
        self.setPalette(palette)
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(2)
        self.setFixedHeight(24)

    def set_content(self, source: str, spans, color_drafts: bool, markdown: bool = True) -> None:
        render(self.document(), source, spans, color_drafts, markdown)
        self._fit()

    def _fit(self) -> None:
        doc, width = self.document(), max(self.viewport().width(), 50)
        if doc.textWidth() != width:  # setting it, even to the same width, lays the whole document out again
            doc.setTextWidth(width)
        height = int(doc.size().height() + 0.999) + self.frameWidth() * 2
        if height != self.height():
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def wheelEvent(self, event) -> None:
        event.ignore()  # let the conversation scroll, not this block


def dark_palette() -> bool:
    return QGuiApplication.palette().color(QPalette.ColorRole.Text).lightness() > 128


def _clip(spans: list[list[int]], end: int) -> list[list[int]]:
    return [[s[0], min(s[1], end), *s[2:]] for s in spans if s[0] < end]


class CodeBlock(QFrame):
    """A fenced code block: its language, a Copy button, and the code in a fixed-pitch font.

    Colours come once the block is complete (while it streams it is plain, which costs nothing): worked
    out on a background thread (render.lex_in_background), then put on COLOUR_SLICE runs per turn of the
    event loop, so the window never waits."""

    # All at once, a 400-line block's 2,400 coloured runs held the GUI thread 30-90 ms on a 2-core CPU.
    COLOUR_SLICE = 300

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setAutoFillBackground(True)
        palette = self.palette()
        base = palette.color(QPalette.ColorRole.Window)
        palette.setColor(QPalette.ColorRole.Window, base.darker(106) if not dark_palette() else base.lighter(130))
        self.setPalette(palette)
        column = QVBoxLayout(self)
        column.setContentsMargins(6, 2, 4, 4)
        column.setSpacing(0)
        header = QHBoxLayout()
        self.language = QLabel()
        self.language.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy this code")
        self.copy_button.setAutoRaise(True)
        self.copy_button.clicked.connect(self.copy)
        header.addWidget(self.language)
        header.addStretch(1)
        header.addWidget(self.copy_button)
        column.addLayout(header)
        self.text = MessageText()
        column.addWidget(self.text)
        self.code = ""
        self.highlighted = False  # the colours are on
        self._key = None
        self._spans: list[list[int]] = []
        self._uncoloured: list = []  # (start, end, format) still to put on, a slice per turn
        self._colouring = QTimer(self, singleShot=True, interval=0)
        self._colouring.timeout.connect(self._colour_slice)
        self._copied = QTimer(self, singleShot=True, interval=1500)  # "Copied" for a moment, then "Copy"
        self._copied.timeout.connect(lambda: self.copy_button.setText("Copy"))

    def set_code(self, fence: CodeFence, spans, final: bool) -> None:
        """Show fence's code; spans are draft spans relative to the chunk (empty: no draft colours)."""
        code_spans = [[s[0] - fence.code_start, s[1] - fence.code_start, *s[2:]] for s in spans or []]
        complete = fence.closed or final
        key = (fence.code, fence.language, str(code_spans), complete)
        if key == self._key:
            return
        if key[:3] != (self._key or ())[:3] or not self.highlighted:
            grown = (
                self._key is not None
                and not self.highlighted
                and fence.code.startswith(self.code)
                and (_clip(code_spans, len(self.code)) == _clip(self._spans, len(self.code)))
            )
            self.highlighted, self._uncoloured = False, []  # colours still to come are for other code
            if grown:  # streaming: only the new text is laid out
                append_code(self.text.document(), fence.code, len(self.code), code_spans)
            else:
                render_code(self.text.document(), fence.code, code_spans)
            self.text._fit()
        self._key, self.code, self._spans = key, fence.code, code_spans
        self.language.setText(fence.language or "code")
        if complete and not self.highlighted:
            lex_in_background(fence.code, fence.language, partial(self._colour, (fence.code, fence.language)), self)

    def _colour(self, what, runs) -> None:
        if runs is None or self._key is None or what != self._key[:2]:
            return  # plain text, or the block changed meanwhile
        self._uncoloured = colour_ranges(runs, dark_palette())
        self._colour_slice()

    def _colour_slice(self) -> None:
        if not self._uncoloured:
            return  # the block changed meanwhile: it is plain again
        now, self._uncoloured = self._uncoloured[: self.COLOUR_SLICE], self._uncoloured[self.COLOUR_SLICE :]
        apply_colours(self.text.document(), now)
        if self._uncoloured:
            self._colouring.start()
        else:
            self.text._fit()  # bold runs can widen a line
            self.highlighted = True

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        self.copy_button.setText("Copied")
        self._copied.start()

    def toPlainText(self) -> str:
        return self.code


class MessageBody(QWidget):
    """A message as a column of chunks (paragraphs, lists, code blocks), each rendered on its own.

    Re-rendering is skipped for chunks whose text and highlight did not change, so a streaming
    response costs only its last chunk per update, however long it grows.
    """

    def __init__(self, parent=None):
        super().__init__(parent)
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.column.setSpacing(6)
        self.chunks: list[MessageText | CodeBlock] = []
        self.keys: list[tuple | None] = []  # what each chunk shows (None: nothing yet)
        self.source = ""
        self.show_all = QToolButton()  # for a message too long to render here (render.fold_point)
        self.show_all.setAutoRaise(True)
        self.show_all.setToolTip("Open the whole message in a viewer")
        self.show_all.clicked.connect(self.open_whole)
        self.show_all.hide()
        self.column.addWidget(self.show_all, 0, Qt.AlignmentFlag.AlignLeft)
        self.viewer: LongTextViewer | None = None

    def set_content(self, source: str, spans, color_drafts: bool, markdown: bool = True, final: bool = True) -> None:
        """final: the text is complete (an unclosed code block is then coloured too). Text past the fold point is
        not rendered: "Show all" opens it."""
        source, spans = shown_bidi(source, spans)
        self.source = source
        fold = fold_point(source)
        self.show_all.setVisible(fold is not None)
        if fold is not None:
            self.show_all.setText(f"Show all ({size_words(len(source))}; {len(source) - fold:,} not shown here)…")
            source, spans = source[:fold], spans_within(spans or [], 0, fold)
        self._set_chunks(source, spans, color_drafts, markdown, final)

    def open_whole(self) -> None:
        self.viewer = LongTextViewer(self.source, parent=self.window())
        self.viewer.show()

    def _set_chunks(self, source: str, spans, color_drafts: bool, markdown: bool, final: bool) -> None:
        pieces = split_blocks(source) if markdown else [(0, len(source))]
        for i, (start, end) in enumerate(pieces or [(0, 0)]):
            part = source[start:end]
            part_spans = spans_within(spans or [], start, end) if color_drafts else []
            fence = code_fence(part) if markdown else None
            kind = CodeBlock if fence is not None else MessageText
            key = (part, markdown, color_drafts, str(part_spans), final)
            if i == len(self.chunks):
                self.chunks.append(kind())
                self.keys.append(None)
                self.column.insertWidget(i, self.chunks[i])  # above the "Show all" button
            elif type(self.chunks[i]) is not kind:  # e.g. "``" became the start of a code block
                old, self.chunks[i] = self.chunks[i], kind()
                self.column.replaceWidget(old, self.chunks[i])
                old.hide()
                old.deleteLater()
                self.keys[i] = None
            if self.keys[i] != key:
                chunk = self.chunks[i]  # a CodeBlock exactly when there is a fence (kind, above)
                if isinstance(chunk, CodeBlock) and fence is not None:
                    chunk.set_code(fence, part_spans, final)
                elif isinstance(chunk, MessageText):
                    chunk.set_content(part, part_spans, color_drafts, markdown)
                chunk.setVisible(bool(part.strip()) or len(pieces) == 1)
                self.keys[i] = key
        for extra in self.chunks[max(len(pieces), 1) :]:
            extra.deleteLater()
        del self.chunks[max(len(pieces), 1) :]
        del self.keys[max(len(pieces), 1) :]

    def code_blocks(self) -> list[CodeBlock]:
        return [c for c in self.chunks if isinstance(c, CodeBlock)]

    def toPlainText(self) -> str:
        return "\n".join(c.toPlainText() for c in self.chunks)


def shown_bidi(source: str, spans):
    """source with its bidi controls shown by their code, not obeyed (engine.text_rules.bidi_shown), and its
    draft spans moved to the same characters."""
    marks = [m.start() for m in BIDI_CONTROLS.finditer(source)]
    if not marks:
        return source, spans

    def moved(i: int) -> int:
        return i + (SHOWN_WIDTH - 1) * bisect_left(marks, i)

    return bidi_shown(source), [[moved(s[0]), moved(s[1]), *s[2:]] for s in spans] if spans else spans


def thought_label(closed: bool, streaming: bool, seconds: float | None) -> str:
    if not closed:
        return "Thinking…" if streaming else "Thought (stopped before it finished)"
    if seconds is None:
        return "Thought"
    return f"Thought for {seconds:.1f} s" if seconds < 10 else f"Thought for {seconds:.0f} s"


class ThoughtFold(QWidget):
    """A reasoning model's thought, folded to one line ("Thought for 4.2 s"); click to read it."""

    def __init__(self, parent=None):
        super().__init__(parent)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        self.toggle = QToolButton()  # not checkable: a pressed-in look would read as a control left on
        self.toggle.setAutoRaise(True)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setToolTip("Show or hide the model's reasoning")
        self.toggle.clicked.connect(lambda: self._toggled(not self.opened))
        column.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.body = MessageBody()
        palette = self.body.palette()  # the thought reads dimmer than the answer
        palette.setColor(QPalette.ColorRole.Text, palette.color(QPalette.ColorRole.PlaceholderText))
        self.body.setPalette(palette)
        self.body.setContentsMargins(14, 0, 0, 0)
        self.body.hide()
        column.addWidget(self.body)
        self.thought = ""
        self.opened = False
        self._final = True

    def set_thought(self, thought: str, label: str, final: bool) -> None:
        self.toggle.setText(label)
        self.thought, self._final = thought, final
        if self.opened:  # a folded thought is not rendered at all: streaming it costs nothing
            self.body.set_content(thought, None, False, True, final)

    def _toggled(self, open_: bool) -> None:
        self.opened = open_
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if open_ else Qt.ArrowType.RightArrow)
        if open_:
            self.body.set_content(self.thought, None, False, True, self._final)
        self.body.setVisible(open_)


class ResponseText(QWidget):
    """An assistant message: its thought (if any) folded above the answer, rendered as markdown."""

    def __init__(self, parent=None):
        super().__init__(parent)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        self.thought = ThoughtFold()
        self.thought.hide()
        self.answer = MessageBody()
        column.addWidget(self.thought)
        column.addWidget(self.answer)

    def set_message(self, m: Message, color_drafts: bool) -> None:
        streaming = m.status == "streaming"
        span = find_thinking(m.content)
        answer_start = 0
        if span is not None:
            seconds = (m.stats or {}).get("thought_s")
            self.thought.set_thought(
                m.content[span.thought_start : span.thought_end].strip(),
                thought_label(span.closed, streaming, seconds),
                not streaming,
            )
            answer_start = span.answer_start
        self.thought.setVisible(span is not None)
        answer = m.content[answer_start:]
        if not answer and streaming and span is None:
            self.answer.set_content("…", None, False, markdown=False)
        else:
            spans = spans_within(m.draft_spans or [], answer_start, len(m.content)) if color_drafts else []
            self.answer.set_content(answer, spans, color_drafts, markdown=True, final=not streaming)
        self.answer.setVisible(bool(answer) or span is None)

    def toPlainText(self) -> str:
        return self.answer.toPlainText()


class UserText(QWidget):
    """A user message: the words as typed, and any attached files as chips (click one to read it)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(4)
        self.body = MessageBody()
        self.files = AttachmentRow()
        column.addWidget(self.body)
        column.addWidget(self.files)

    def set_message(self, m: Message, color_drafts: bool) -> None:
        text, files = split_attachments(m.content)
        self.body.set_content(text.strip() if files else text, None, False, markdown=False)
        self.body.setVisible(bool(text.strip()) or not files)
        self.files.set_attachments(files)

    def toPlainText(self) -> str:
        return self.body.toPlainText()
