"""The figures under each response, live while it streams and kept afterwards, and a sparkline of
tokens/sec. The words are app/figure_texts.py's."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QSize, Qt
from PySide6.QtGui import QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QWidget

from app.figure_texts import detail_lines, stat_items


class Sparkline(QWidget):
    """Tokens/sec over the response's lifetime, as a small line."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.points: list[tuple[float, float]] = []
        self.setFixedSize(QSize(90, 18))
        self.setToolTip("Tokens/sec over this response")

    def set_points(self, points) -> None:
        self.points = [(float(t), float(r)) for t, r in points or []]
        self.update()

    def paintEvent(self, _event) -> None:
        if len(self.points) < 2:
            return
        t0, t1 = self.points[0][0], self.points[-1][0]
        top = max(r for _, r in self.points) or 1.0
        w, h = self.width() - 2, self.height() - 2
        path = QPainterPath()
        for i, (t, r) in enumerate(self.points):
            p = QPointF(1 + (t - t0) / ((t1 - t0) or 1.0) * w, 1 + h - r / top * h)
            path.moveTo(p) if i == 0 else path.lineTo(p)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(QPen(self.palette().color(QPalette.ColorRole.Highlight), 1.5))
        painter.drawPath(path)


class StatsBar(QWidget):
    """One line of figures under a response."""

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.label.setWordWrap(True)
        self.label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        font = self.label.font()
        font.setPointSizeF(font.pointSizeF() * 0.88)
        self.label.setFont(font)
        self.label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.sparkline = Sparkline()
        layout.addWidget(self.sparkline, 0, Qt.AlignmentFlag.AlignVCenter)
        layout.addWidget(self.label, 1)
        self.items: list[tuple[str, str, str]] = []

    def set_stats(self, stats: dict | None, show_sparkline: bool = True) -> None:
        self.items = stat_items(stats or {})
        self.label.setText(self.text())
        self.label.setToolTip(
            "\n".join([f"{text}: {tip}" for _, text, tip in self.items] + [""] + detail_lines(stats or {})).strip()
        )
        self.sparkline.set_points((stats or {}).get("rate_history"))
        self.sparkline.setVisible(show_sparkline and len(self.sparkline.points) >= 2)

    def text(self) -> str:
        return "  ·  ".join(text for _, text, _ in self.items)
