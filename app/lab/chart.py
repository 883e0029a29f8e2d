"""One lab measure against concurrency (a log2 axis), a line per method, points added as cells finish."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QLogValueAxis, QValueAxis
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPainter, QPen

from engine.lab.report import METHOD_COLOURS
from engine.methods import method_words

SERVER_COLOURS = ("#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")  # servers named otherwise (remote labs)
# The legend's words: short, as two charts side by side leave each ~300 px (the long ones were cut to "plain deco…");
# the table beside it says each method in full.
LEGEND_WORDS = method_words("legend")


class LabChart(QChartView):
    def __init__(self, title: str, unit: str, key: str | Callable[[dict], float | None], parent=None):
        super().__init__(parent)
        self.key = key
        self.chart_ = QChart()
        self.chart_.setTitle(title)
        self.chart_.legend().setAlignment(Qt.AlignmentFlag.AlignBottom)
        self.x_axis = QLogValueAxis()
        self.x_axis.setBase(2)
        self.x_axis.setLabelFormat("%d")
        self.x_axis.setTitleText("concurrent sequences")
        self.y_axis = QValueAxis()
        self.y_axis.setTitleText(unit)
        self.chart_.addAxis(self.x_axis, Qt.AlignmentFlag.AlignBottom)
        self.chart_.addAxis(self.y_axis, Qt.AlignmentFlag.AlignLeft)
        self.setChart(self.chart_)
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setMinimumSize(300, 260)  # two side by side beside the form fit the window's default width
        self.series: dict[str, QLineSeries] = {}
        self.markers: list[QLineSeries] = []
        self.clear()

    def clear(self) -> None:
        self.chart_.removeAllSeries()
        self.series.clear()
        self.markers.clear()
        self.x_axis.setRange(1, 8)
        self.y_axis.setRange(0, 1)

    def add(self, cell: dict) -> None:
        value = self.key(cell) if callable(self.key) else cell.get(self.key)
        if value is None:
            return
        method = cell["method"]
        series = self.series.get(method)
        if series is None:
            series = self.series[method] = QLineSeries()
            series.setName(LEGEND_WORDS.get(method, method))
            series.setPointsVisible(True)
            other = SERVER_COLOURS[len(self.series) % len(SERVER_COLOURS)]  # a server named otherwise
            series.setColor(QColor(METHOD_COLOURS.get(method) or other))
            self.chart_.addSeries(series)
            series.attachAxis(self.x_axis)
            series.attachAxis(self.y_axis)
        series.append(cell["concurrency"], value)
        self._rescale()

    def mark(self, at: float, method: str) -> None:
        """A dashed vertical line, in the method's colour, where its speculation stops paying."""
        marker = QLineSeries()
        marker.setName(f"{LEGEND_WORDS.get(method, method)} stops paying")
        series = self.series.get(method)
        pen = QPen(series.color() if series is not None else QColor("#888888"))
        pen.setStyle(Qt.PenStyle.DashLine)
        marker.setPen(pen)
        top = self.y_axis.max()
        marker.append(at, 0)
        marker.append(at, top)
        self.chart_.addSeries(marker)
        marker.attachAxis(self.x_axis)
        marker.attachAxis(self.y_axis)
        self.markers.append(marker)

    def _rescale(self) -> None:
        points = [p for s in self.series.values() for p in s.points()]
        xs, ys = [p.x() for p in points], [p.y() for p in points]
        self.x_axis.setRange(min(xs + [1]), max(xs + [2]))
        self.y_axis.setRange(0, max(ys) * 1.15 if ys and max(ys) > 0 else 1)

    def points(self, method: str) -> list[tuple[float, float]]:
        series = self.series.get(method)
        return [(p.x(), p.y()) for p in series.points()] if series else []
