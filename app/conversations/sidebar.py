"""The saved conversations beside the chat: new, search, rename (double-click or F2), delete."""

from __future__ import annotations

import sqlite3
import time

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.conversations.store import Conversation, ConversationStore
from app.safe_text import message

ConversationIdRole = Qt.ItemDataRole.UserRole + 1


def not_written(what: str, exc: sqlite3.Error) -> str:
    """Why a conversation was not renamed or deleted, for a person."""
    return (
        f"The conversation was not {what}: the conversation file cannot be written now ({exc}); it may be busy "
        "with an import, or the disk may be full. Nothing was changed; try again in a moment."
    )


class ConversationListModel(QAbstractListModel):
    def __init__(self, store: ConversationStore, parent=None):
        super().__init__(parent)
        self.store = store
        self.search = ""
        self.rows: list[Conversation] = []
        self.reload()

    def reload(self) -> None:
        self.beginResetModel()
        self.rows = self.store.conversations(self.search)
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.rows):
            return None
        conv = self.rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return conv.title
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{conv.title}\nLast active {time.strftime('%Y-%m-%d %H:%M', time.localtime(conv.updated_at))}"
        if role == ConversationIdRole:
            return conv.id
        return None

    def flags(self, index):
        return super().flags(index) | Qt.ItemFlag.ItemIsEditable

    def setData(self, index, value, role=Qt.ItemDataRole.EditRole) -> bool:
        if role != Qt.ItemDataRole.EditRole or not index.isValid() or not str(value).strip():
            return False
        conv = self.rows[index.row()]
        try:
            self.store.rename(conv.id, str(value))
        except sqlite3.Error as exc:  # busy (an import being stored) or a full disk: said, nothing changed
            message(None, QMessageBox.Icon.Warning, "Rename conversation", not_written("renamed", exc))
            return False
        conv.title = str(value).strip()
        self.dataChanged.emit(index, index)
        return True

    def row_of(self, conversation_id: int) -> int:
        return next((i for i, c in enumerate(self.rows) if c.id == conversation_id), -1)


class ConversationPanel(QWidget):
    conversationSelected = Signal(int)
    newRequested = Signal()
    deleted = Signal(int)
    renamed = Signal(int)  # a conversation's title was edited here (the window's title follows)

    def __init__(self, store: ConversationStore, parent=None):
        super().__init__(parent)
        self.store = store
        self.model = ConversationListModel(store, self)
        self.model.dataChanged.connect(self._renamed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.newRequested)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self, singleShot=True, interval=200)
        self._search_timer.timeout.connect(self._apply_search)
        self.search.textChanged.connect(lambda _t: self._search_timer.start())
        self.list = QListView()
        self.list.setModel(self.model)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(True)
        self.list.setSpacing(2)
        self.list.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked | QAbstractItemView.EditTrigger.EditKeyPressed
        )
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.selectionModel().currentChanged.connect(self._current_changed)
        delete = QAction("Delete", self.list)
        delete.setShortcut(QKeySequence.StandardKey.Delete)
        delete.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        delete.triggered.connect(self.delete_current)
        self.list.addAction(delete)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        self._quiet = False

    def reload(self, select_id: int | None = None) -> None:
        self._quiet = True
        self.model.reload()
        if select_id is not None:
            self.select(select_id)
        self._quiet = False

    def select(self, conversation_id: int) -> None:
        row = self.model.row_of(conversation_id)
        if row >= 0:
            quiet, self._quiet = self._quiet, True
            self.list.setCurrentIndex(self.model.index(row))
            self._quiet = quiet

    def current_id(self) -> int | None:
        index = self.list.currentIndex()
        return index.data(ConversationIdRole) if index.isValid() else None

    def _current_changed(self, current: QModelIndex, _previous) -> None:
        if not self._quiet and current.isValid():
            self.conversationSelected.emit(current.data(ConversationIdRole))

    def _renamed(self, first: QModelIndex, last: QModelIndex, _roles=()) -> None:
        for row in range(first.row(), last.row() + 1):
            self.renamed.emit(self.model.rows[row].id)

    def _apply_search(self) -> None:
        keep = self.current_id()
        self.model.search = self.search.text().strip()
        self.reload(keep)

    def _menu(self, pos) -> None:
        index = self.list.indexAt(pos)
        if not index.isValid():
            return
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.edit(index))
        menu.addAction("Delete", lambda: self.delete(index.data(ConversationIdRole)))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def delete_current(self) -> None:
        cid = self.current_id()
        if cid is not None:
            self.delete(cid)

    def delete(self, conversation_id: int, confirm: bool = True) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        if (
            confirm
            and QMessageBox.question(
                self, "Delete conversation", f"Delete “{conv.title}” and all its messages? This cannot be undone."
            )
            != QMessageBox.StandardButton.Yes
        ):
            return
        try:
            self.store.delete_conversation(conversation_id)
        except sqlite3.Error as exc:
            message(self, QMessageBox.Icon.Warning, "Delete conversation", not_written("deleted", exc))
            return
        self.reload()
        self.deleted.emit(conversation_id)
