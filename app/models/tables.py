"""The read-only, one-row-at-a-time tables of the Models dialog: each row carries its key in column 0."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem


def make_table(headers: list[str]) -> QTableWidget:
    table = QTableWidget(0, len(headers))
    table.setHorizontalHeaderLabels(headers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return table


def set_row(table: QTableWidget, row: int, cells: list[str], data: object, tooltip: str) -> None:
    """One row of text cells; data is its key (a spec, a path or a row number), which selected_key gives back."""
    for column, text in enumerate(cells):
        item = QTableWidgetItem(text)
        item.setToolTip(tooltip)
        if column == 0:
            item.setData(Qt.ItemDataRole.UserRole, data)
        table.setItem(row, column, item)


def selected_key(table: QTableWidget):
    """The key of the selected row, or None."""
    rows = table.selectionModel().selectedRows() if table.selectionModel() else []
    item = table.item(rows[0].row(), 0) if rows else None
    return item.data(Qt.ItemDataRole.UserRole) if item is not None else None
