"""Salvage: the rows of a damaged conversation file that can still be read, copied into a new one (open_store in
store.py keeps the damaged file aside and starts the new one). Every route to a row is tried: an index, and each
table read from both ends, since a scan stops at the first damaged page. No Qt here."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from app.conversations.schema import COLUMNS, TREE_COLUMNS

_NO_TREE = object()  # a copied message's parent when its file had no tree: it follows the message before it


def salvage(source_path: Path, db: sqlite3.Connection) -> tuple[int, int]:
    """Copy the readable conversations and messages of the file at source_path into db (a store's, of this
    schema), row by row: (messages copied, messages found)."""
    try:
        source = sqlite3.connect(f"{source_path.resolve().as_uri()}?mode=ro", uri=True)  # with its WAL, if any
    except sqlite3.Error:
        return 0, 0
    counts, now = {}, time.time()
    has_tree = _has_column(source, "messages", "parent_id")  # files from before schema version 3 have none
    parents: dict[int, object] = {}  # copied message id -> its parent in the file
    db.execute("BEGIN")
    try:
        for table, columns in COLUMNS.items():
            names = ", ".join(columns)
            insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})"
            tree_columns = TREE_COLUMNS[table] if has_tree else ()
            read = ", ".join(columns + tree_columns)
            ids = _readable_ids(source, table)
            copied = 0
            for row_id in ids:
                try:
                    row = source.execute(f"SELECT {read} FROM {table} WHERE id=?", (row_id,)).fetchone()
                    if row is None:
                        continue
                    if table == "messages":  # a message whose conversation was lost gets one of its own
                        db.execute(
                            "INSERT OR IGNORE INTO conversations (id, title, created_at, updated_at) "
                            "VALUES (?, 'Recovered chat', ?, ?)",
                            (row[1], now, now),
                        )
                    db.execute(insert, row[: len(columns)])
                    copied += 1
                    tree = dict(zip(tree_columns, row[len(columns) :]))
                    if table == "messages":
                        parents[row_id] = tree.get("parent_id", _NO_TREE)
                    if tree_columns and row[-1] is not None:  # the branch chosen (one that is gone is ignored)
                        db.execute(f"UPDATE {table} SET {tree_columns[-1]}=? WHERE id=?", (row[-1], row_id))
                except sqlite3.Error:
                    pass  # it sits on a damaged page, or its values no longer make sense
            counts[table] = copied, len(ids)
        if _has_column(source, "conversations", "settings"):  # schema version 2: each chat's own settings
            _copy_settings(source, db)
        _relink(db, parents)
    finally:
        db.execute("COMMIT")
        source.close()
    return counts["messages"]


def _copy_settings(source: sqlite3.Connection, db: sqlite3.Connection) -> None:
    for cid in _readable_ids(source, "conversations"):
        try:
            row = source.execute("SELECT settings FROM conversations WHERE id=?", (cid,)).fetchone()
            if row and row[0] is not None:
                db.execute("UPDATE conversations SET settings=? WHERE id=?", (row[0], cid))
        except sqlite3.Error:
            pass  # on a damaged page: that chat follows the default preset


def _relink(db: sqlite3.Connection, parents: dict[int, object]) -> None:
    """Link copied messages into their trees: each to its parent where that was copied too, else (its
    parent was lost, or the file had no tree) to the message before it, so every one stays reachable."""
    previous: dict[int, int] = {}  # conversation -> the last message linked
    conversation_of = dict(db.execute("SELECT id, conversation_id FROM messages").fetchall())
    for message_id in sorted(parents):
        cid, parent = conversation_of[message_id], parents[message_id]
        if parent is not None:
            if parent not in conversation_of or conversation_of[parent] != cid:
                parent = previous.get(cid)
            db.execute("UPDATE messages SET parent_id=? WHERE id=?", (parent, message_id))
        previous[cid] = message_id


def _has_column(db: sqlite3.Connection, table: str, column: str) -> bool:
    try:
        return any(row[1] == column for row in db.execute(f"PRAGMA table_info({table})"))
    except sqlite3.Error:
        return False


def _readable_ids(db: sqlite3.Connection, table: str) -> list[int]:
    """Row ids, gathered by every route that may still work: an index, and the table read from both ends
    (a scan stops at the first damaged page; the other end reaches the rows past it)."""
    ids: set[int] = set()
    queries = [f"SELECT id FROM {table} ORDER BY id", f"SELECT id FROM {table} ORDER BY id DESC"]
    if table == "messages":
        queries.append("SELECT id FROM messages INDEXED BY messages_by_conversation")
    for query in queries:
        try:
            for (row_id,) in db.execute(query):
                ids.add(row_id)
        except sqlite3.DatabaseError:
            pass
    return sorted(ids)
