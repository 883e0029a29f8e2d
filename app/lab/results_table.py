"""The lab's measured cells as a table: one row per method and concurrency, "n/a" where nothing was read."""
from __future__ import annotations

from PySide6.QtWidgets import QTableWidget, QTableWidgetItem

from engine.measure.lab_report import METHOD_WORDS

NA = "n/a"
HEADERS = ["method", "concurrency", "aggregate tok/s", "per-request tok/s", "ITL p50 / p95 ms",
           "end-to-end p50 / p95 s", "acceptance", "utilisation / memory"]


def _fmt(value, fmt: str) -> str:
    return NA if value is None else format(value, fmt)


def cell_texts(c: dict) -> list[str]:
    """What the table shows of one cell, column by column."""
    util, mem = c.get("utilisation") or {}, c.get("memory") or {}
    util_text = f"{util.get('kind', '?')} {_fmt(util.get('percent'), '.0f')}%"
    mem_text = f"{mem.get('kind', '?')} {_fmt(mem.get('bytes') and mem['bytes'] / 2**30, '.2f')} GiB"
    acc = c.get("acceptance_rate")
    return [METHOD_WORDS.get(c["method"], c["method"]), str(c["concurrency"]),
            _fmt(c.get("aggregate_tokens_per_s"), ".1f"), _fmt(c.get("per_request_tokens_per_s"), ".1f"),
            f"{_fmt(c.get('itl_p50_ms'), '.1f')} / {_fmt(c.get('itl_p95_ms'), '.1f')}",
            f"{_fmt(c.get('e2e_p50_s'), '.2f')} / {_fmt(c.get('e2e_p95_s'), '.2f')}",
            NA if acc is None else f"{acc:.0%} (mean length {c['mean_acceptance_length']:.2f})",
            f"{util_text} · {mem_text}"]


class ResultsTable(QTableWidget):
    def __init__(self, parent=None):
        super().__init__(0, len(HEADERS), parent)
        self.setHorizontalHeaderLabels(HEADERS)
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QTableWidget.NoEditTriggers)

    def add_cell(self, cell: dict) -> None:
        row = self.rowCount()
        self.insertRow(row)
        for col, text in enumerate(cell_texts(cell)):
            self.setItem(row, col, QTableWidgetItem(text))
        self.resizeColumnsToContents()
