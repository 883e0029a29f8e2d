"""Saved conversations: SQLite in the user data dir, in WAL mode.

Every write is its own committed transaction, so a response saved while it streams survives a
crash or a kill of the app. A message still marked "streaming" when the store opens was cut off
by such a crash; it is marked "interrupted" and kept. No Qt here; the GUI thread owns the store.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.paths import data_dir

FILE_NAME = "conversations.sqlite3"
STATUSES = ("done", "streaming", "stopped", "error", "interrupted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'done',
    model TEXT NOT NULL DEFAULT '',
    stats TEXT,            -- JSON of the response's GenerationStats, as shown
    draft_spans TEXT,      -- JSON [[start, end], ...]: characters that came from accepted drafts
    notice TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


@dataclass
class Conversation:
    id: int
    title: str
    updated_at: float


@dataclass
class Message:
    id: int | None
    role: str
    content: str = ""
    status: str = "done"
    model: str = ""
    stats: dict | None = None
    draft_spans: list[list[int]] = field(default_factory=list)
    notice: str = ""


def default_path() -> Path:
    return data_dir() / FILE_NAME


class ConversationStore:
    def __init__(self, path: Path | None = None):
        self.path = Path(path or default_path())
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=5.0)  # autocommit per statement
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a killed app loses no committed write
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError:
            self.db.close()
            raise
        self.recovered = self.db.execute(
            "UPDATE messages SET status='interrupted' WHERE status='streaming'").rowcount

    # --- conversations ------------------------------------------------------------------------
    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; with search, those whose title or any message contains it."""
        if search:
            pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self.db.execute(
                "SELECT id, title, updated_at FROM conversations c WHERE title LIKE ?1 ESCAPE '\\' OR EXISTS "
                "(SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.content LIKE ?1 ESCAPE '\\') "
                "ORDER BY updated_at DESC, id DESC", (pattern,))
        else:
            rows = self.db.execute("SELECT id, title, updated_at FROM conversations ORDER BY updated_at DESC, id DESC")
        return [Conversation(*r) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute("SELECT id, title, updated_at FROM conversations WHERE id=?",
                              (conversation_id,)).fetchone()
        return Conversation(*row) if row else None

    def create_conversation(self, title: str = "New chat") -> int:
        now = time.time()
        return self.db.execute("INSERT INTO conversations(title, created_at, updated_at) VALUES (?, ?, ?)",
                               (title, now, now)).lastrowid

    def rename(self, conversation_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title=? WHERE id=?", (title.strip() or "Untitled", conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def touch(self, conversation_id: int) -> None:
        self.db.execute("UPDATE conversations SET updated_at=? WHERE id=?", (time.time(), conversation_id))

    # --- messages -----------------------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute(
            "SELECT id, role, content, status, model, stats, draft_spans, notice FROM messages "
            "WHERE conversation_id=? ORDER BY id", (conversation_id,))
        return [Message(id=r[0], role=r[1], content=r[2], status=r[3], model=r[4], stats=_load(r[5], None),
                        draft_spans=_load(r[6], []), notice=r[7]) for r in rows]

    def add_message(self, conversation_id: int, message: Message) -> int:
        message.id = self.db.execute(
            "INSERT INTO messages(conversation_id, role, content, status, model, stats, draft_spans, notice, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, message.role, message.content, message.status, message.model,
             _dump(message.stats), _dump(message.draft_spans), message.notice, time.time())).lastrowid
        self.touch(conversation_id)
        return message.id

    def update_message(self, message: Message) -> None:
        self.db.execute(
            "UPDATE messages SET content=?, status=?, model=?, stats=?, draft_spans=?, notice=? WHERE id=?",
            (message.content, message.status, message.model, _dump(message.stats), _dump(message.draft_spans),
             message.notice, message.id))

    def delete_messages(self, ids: list[int]) -> None:
        self.db.executemany("DELETE FROM messages WHERE id=?", [(i,) for i in ids])

    def close(self) -> None:
        self.db.close()


def _dump(value) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _load(text: str | None, default):
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def open_store(path: Path | None = None) -> tuple[ConversationStore, list[str]]:
    """The store, and notices. A file SQLite cannot read is kept aside, never deleted."""
    path = Path(path or default_path())
    try:
        store = ConversationStore(path)
        store.conversations()
    except sqlite3.DatabaseError as exc:
        kept = path.with_name(f"{path.stem}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}{path.suffix}")
        for suffix in ("", "-wal", "-shm"):
            side = Path(str(path) + suffix)
            if side.exists():
                side.replace(Path(str(kept) + suffix))
        store = ConversationStore(path)
        return store, [f"The conversation file could not be read ({exc}). It was kept as {kept.name} and a new "
                       "one was started."]
    notices = []
    if store.recovered:
        notices.append(f"{store.recovered} response{'s were' if store.recovered != 1 else ' was'} cut off when "
                       "SpecChat last closed unexpectedly; the text saved up to then is kept, marked interrupted.")
    return store, notices
