"""One side of the Compare window: a run's streamed text, its tokens/s in large type, and its other figures."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QGroupBox, QLabel, QPlainTextEdit, QTextEdit, QVBoxLayout

from app.chat.render import DRAFT_COLOR
from app.compare.series import SPECULATIVE
from app.figure_texts import stat_items

DIFFERENCE_COLOR = QColor(198, 40, 40, 60)  # translucent red: readable on light and dark themes
PAUSED_WORDS = "drafting paused at the end (plain decoding predicted faster)"


def paused_at_the_end(stats: dict) -> bool:
    """The planner's latest verdict was "plain is faster" AND the last step drafted nothing: the flag alone
    outlives the step that set it (a run can draft to its end after it), so alone it is no claim."""
    return bool(stats.get("speculation_paused")) and stats.get("draft_length") == 0


class RunPane(QGroupBox):
    """One side: the streamed text, its tokens/s in large type, and the other measured figures."""

    def __init__(self, kind: str, parent=None):
        super().__init__(parent)
        self.kind = kind
        self.segments: list[tuple[str, bool]] = []
        self.stats: dict = {}
        self.text = QPlainTextEdit(readOnly=True)
        self.speed = QLabel("–")  # before a run too: the space above the text is not left blank
        font = self.speed.font()
        font.setPointSizeF(font.pointSizeF() * 1.6)
        font.setBold(True)
        self.speed.setFont(font)
        self.figures = QLabel("Not run yet.")
        self.figures.setWordWrap(True)
        self.figures.setTextFormat(Qt.TextFormat.PlainText)
        self.figures.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.legend = QLabel("Shaded: tokens that came from accepted drafts." if kind == SPECULATIVE else "")
        self.legend.setVisible(kind == SPECULATIVE)
        layout = QVBoxLayout(self)
        layout.addWidget(self.speed)
        layout.addWidget(self.figures)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.legend)

    def reset(self, waiting: str = "Waiting for the engine…") -> None:
        self.segments, self.stats = [], {}
        self.text.clear()
        self.text.setExtraSelections([])
        self.speed.setText("–")
        self.figures.setText(waiting)

    def add(self, segments: list[tuple[str, bool]]) -> None:
        self.segments += segments
        cursor = self.text.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for text, from_draft in segments:
            fmt = QTextCharFormat()
            if from_draft and self.kind == SPECULATIVE:
                fmt.setBackground(DRAFT_COLOR)
            cursor.insertText(text, fmt)

    def show_run(self, segments: list[tuple[str, bool]], stats: dict) -> None:
        """Show a finished run again (the pair whose texts part, after the series)."""
        self.reset()
        self.add(segments)
        self.show_stats(stats)

    def show_stats(self, stats: dict) -> None:
        self.stats = stats or {}
        items = {key: text for key, text, _ in stat_items({**self.stats, "memory_label": ""})}
        self.speed.setText(items["speed"])
        ttft = items["ttft"]
        prompt = self.stats.get("prompt_tokens")
        if prompt and self.stats.get("reused_prompt_tokens") == prompt:
            ttft += " (prompt already processed by an earlier run)"
        parts = [ttft, f"{self.stats.get('generated', 0)} tokens"]
        if self.kind == SPECULATIVE:
            parts += [items.get("acceptance", "accepted n/a"), items.get("mean_length", "n/a tok/step")]
            if paused_at_the_end(self.stats):
                parts.append(PAUSED_WORDS)
        if items.get("finish"):
            parts.append(items["finish"])
        self.figures.setText("  ·  ".join(parts))

    def plain_text(self) -> str:
        return "".join(t for t, _ in self.segments)

    def mark_from(self, chars: int) -> None:
        """Shade the text from this character on, where the two sides part."""
        utf16 = len(self.plain_text()[:chars].encode("utf-16-le")) // 2  # Qt counts UTF-16 units
        selection = QTextEdit.ExtraSelection()
        selection.format.setBackground(DIFFERENCE_COLOR)
        cursor = QTextCursor(self.text.document())
        cursor.setPosition(min(utf16, self.text.document().characterCount() - 1))
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        selection.cursor = cursor
        self.text.setExtraSelections([selection])
