"""The messages of the open conversation, as a Qt list model. The single source the view reads.

A conversation is a tree (edits and regenerations are siblings of what they replace, see store.py);
the model holds the branch shown, and for each of its messages the ids of its siblings, so the view
can show "2 / 3" and step to the others.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt

from app.conversations.store import Message

MessageRole = Qt.ItemDataRole.UserRole + 1  # the Message object itself
BranchRole = Qt.ItemDataRole.UserRole + 2  # (position, count) among its siblings, from 1: the "2 / 3"
CONTINUABLE = ("stopped", "interrupted")  # besides a "done" answer cut at the length limit


def continuable(message: Message) -> bool:
    """An answer that was cut short (by the length limit, by you, or by the app closing) and can go on."""
    if message.role != "assistant" or not message.content:
        return False
    return message.status in CONTINUABLE or (
        message.status == "done" and (message.stats or {}).get("finish_reason") == "length"
    )


PROPOSERS = (
    "lookup",
    "draft",
    "mtp",
    "eagle3",
)  # the proposers a span may name; a span of two numbers names none (older answers)


def span_source(span) -> str | None:
    """Who proposed a draft span's characters: "lookup", "draft", "mtp", "eagle3", or None where it was not recorded."""
    return span[2] if len(span) > 2 and span[2] in PROPOSERS else None


def add_segments(message: Message, segments: list[tuple[str, object]]) -> None:
    """Append streamed text; characters from accepted drafts extend the message's draft spans. A segment's source
    is None or False (the target's own token), "lookup", "draft" or "mtp" (that proposer's accepted draft), or any other
    true value (drafted, proposer unknown): spans are [start, end, proposer], or [start, end] when unknown."""
    spans = message.draft_spans
    pos = len(message.content)
    parts = []
    for text, source in segments:
        if not text:
            continue
        parts.append(text)
        if source:
            tag = [source] if isinstance(source, str) and source in PROPOSERS else []
            if spans and spans[-1][1] == pos and spans[-1][2:] == tag:
                spans[-1][1] = pos + len(text)
            else:
                spans.append([pos, pos + len(text), *tag])
        pos += len(text)
    message.content += "".join(parts)


class ChatModel(QAbstractListModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.items: list[Message] = []
        self.siblings: list[Sequence[int | None]] = []  # per row: ids of the messages that answer the same parent

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
        if role == BranchRole:
            return self.branch(index.row())
        return None

    # --- changes ------------------------------------------------------------------------------
    def set_messages(self, messages: list[Message], siblings: Sequence[Sequence[int | None]] | None = None) -> None:
        self.beginResetModel()
        self.items = list(messages)
        self.siblings = list(siblings) if siblings is not None else [[m.id] for m in messages]
        self.endResetModel()

    def show_path(self, messages: list[Message], siblings: Sequence[Sequence[int | None]]) -> None:
        """Show another branch of the same conversation: rows it shares with the one shown stay (their
        widgets too), the rest are removed and inserted."""
        keep = 0
        while (
            keep < min(len(self.items), len(messages))
            and self.items[keep].id is not None
            and self.items[keep].id == messages[keep].id
        ):
            keep += 1
        self.remove_from(keep)
        for row in range(keep):
            if self.siblings[row] != siblings[row]:
                self.siblings[row] = list(siblings[row])
                self.changed(row)
        if keep < len(messages):
            self.beginInsertRows(QModelIndex(), keep, len(messages) - 1)
            self.items += messages[keep:]
            self.siblings += [list(s) for s in siblings[keep:]]
            self.endInsertRows()

    def append(self, message: Message, siblings: Sequence[int | None] | None = None) -> int:
        row = len(self.items)
        self.beginInsertRows(QModelIndex(), row, row)
        self.items.append(message)
        self.siblings.append(list(siblings) if siblings is not None else [message.id])
        self.endInsertRows()
        return row

    def remove_from(self, row: int) -> list[Message]:
        """Remove rows row.. (the end); returns them."""
        if row >= len(self.items):
            return []
        self.beginRemoveRows(QModelIndex(), row, len(self.items) - 1)
        removed = self.items[row:]
        del self.items[row:]
        del self.siblings[row:]
        self.endRemoveRows()
        return removed

    def changed(self, row: int) -> None:
        """Tell views that the message in row changed (text, stats, status or notice)."""
        index = self.index(row)
        self.dataChanged.emit(index, index, [MessageRole])

    def add_segments(self, row: int, segments: list[tuple[str, object]]) -> None:
        add_segments(self.items[row], segments)
        self.changed(row)

    def message(self, row: int) -> Message:
        return self.items[row]

    def row_of(self, message: Message) -> int:
        for i, item in enumerate(self.items):
            if item is message:
                return i
        return -1

    # --- branches -----------------------------------------------------------------------------
    def branch(self, row: int) -> tuple[int, int]:
        """(position, count) of the message in row among its siblings, counting from 1."""
        ids, own = self.siblings[row], self.items[row].id
        return (ids.index(own) + 1 if own in ids else 1), max(len(ids), 1)

    def sibling_id(self, row: int, step: int) -> int | None:
        """The id of the sibling step places after (or, negative, before) the message in row, if any."""
        ids, own = self.siblings[row], self.items[row].id
        if own not in ids:
            return None
        target = ids.index(own) + step
        return ids[target] if 0 <= target < len(ids) else None
