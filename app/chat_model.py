"""The messages of the open conversation, as a Qt list model. The single source the view reads."""
from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt

from .store import Message

MessageRole = Qt.ItemDataRole.UserRole + 1  # the Message object itself


def add_segments(message: Message, segments: list[tuple[str, bool]]) -> None:
    """Append streamed text; characters from accepted drafts extend the message's draft spans."""
    spans = message.draft_spans
    pos = len(message.content)
    parts = []
    for text, from_draft in segments:
        if not text:
            continue
        parts.append(text)
        if from_draft:
            if spans and spans[-1][1] == pos:
                spans[-1][1] = pos + len(text)
            else:
                spans.append([pos, pos + len(text)])
        pos += len(text)
    message.content += "".join(parts)


class ChatModel(QAbstractListModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.items: list[Message] = []

    # --- Qt model interface -------------------------------------------------------------------
    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.items)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.items):
            return None
        item = self.items[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return item.content
        if role == MessageRole:
            return item
        return None

    # --- changes ------------------------------------------------------------------------------
    def set_messages(self, messages: list[Message]) -> None:
        self.beginResetModel()
        self.items = list(messages)
        self.endResetModel()

    def append(self, message: Message) -> int:
        row = len(self.items)
        self.beginInsertRows(QModelIndex(), row, row)
        self.items.append(message)
        self.endInsertRows()
        return row

    def remove_from(self, row: int) -> list[Message]:
        """Remove rows row.. (the end); returns them."""
        if row >= len(self.items):
            return []
        self.beginRemoveRows(QModelIndex(), row, len(self.items) - 1)
        removed = self.items[row:]
        del self.items[row:]
        self.endRemoveRows()
        return removed

    def changed(self, row: int) -> None:
        """Tell views that the message in row changed (text, stats, status or notice)."""
        index = self.index(row)
        self.dataChanged.emit(index, index, [MessageRole])

    def add_segments(self, row: int, segments: list[tuple[str, bool]]) -> None:
        add_segments(self.items[row], segments)
        self.changed(row)

    def message(self, row: int) -> Message:
        return self.items[row]

    def row_of(self, message: Message) -> int:
        for i, item in enumerate(self.items):
            if item is message:
                return i
        return -1
