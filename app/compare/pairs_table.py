"""The per-pair figures of a comparison, one row a pair, so that the median and range can be checked by eye."""

from __future__ import annotations

from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

from app.compare.series import PLAIN, SPECULATIVE, Pair

COLUMNS = (
    "Pair",
    "Ran first",
    "Plain tok/s",
    "Speculative tok/s",
    "Speculative ÷ plain",
    "Texts",
    "Other programs' CPU",
)


def _rate(pair: Pair, kind: str) -> str:
    run = pair.runs.get(kind)
    if run is None:  # the side that runs first, or the second once the first is done, is the one running
        return "running…" if kind == pair.first or pair.first in pair.runs else "next"
    rate = run.stats.get("tokens_per_s")
    return f"{rate:.1f}" if rate else "n/a"


def row_texts(index: int, pair: Pair) -> list[str]:
    ratio, parted, share = pair.ratio, pair.parted, pair.others_share
    texts = "…" if not pair.done else ("same" if parted is None else f"part at token {parted[0] + 1}")
    return [
        str(index),
        "plain" if pair.first == PLAIN else "speculative",
        _rate(pair, PLAIN),
        _rate(pair, SPECULATIVE),
        f"{ratio:.2f}×" if ratio else ("…" if not pair.done else "n/a"),
        texts,
        f"{share:.0%}" if share is not None else ("…" if not pair.done else "n/a"),
    ]


class PairsTable(QTableWidget):
    def __init__(self, parent=None):
        super().__init__(0, len(COLUMNS), parent)
        self.setHorizontalHeaderLabels(COLUMNS)
        self.verticalHeader().hide()
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        tip = (
            "Other programs' share of all cores' CPU time during the pair's runs (this process's own left out), "
            "the busier of its two runs"
        )
        self.horizontalHeaderItem(len(COLUMNS) - 1).setToolTip(tip)
        # MIN_PAIRS rows and a little more without scrolling
        self.setMinimumHeight(self.verticalHeader().defaultSectionSize() * 4 + header.sizeHint().height() + 4)

    def show_pairs(self, pairs: list[Pair]) -> None:
        self.setRowCount(len(pairs))
        for row, pair in enumerate(pairs):
            for column, text in enumerate(row_texts(row + 1, pair)):
                self.setItem(row, column, QTableWidgetItem(text))
        if pairs:
            self.scrollToBottom()

    def rows(self) -> list[list[str]]:
        return [
            [item.text() if (item := self.item(r, c)) is not None else "" for c in range(self.columnCount())]
            for r in range(self.rowCount())
        ]
