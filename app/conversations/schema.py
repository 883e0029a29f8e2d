"""The conversation file's schema and its migrations (PRAGMA user_version): the tables as version 1 made them, and
each step since. ConversationStore (store.py) runs the steps a file needs when it opens it; salvage.py copies
rows by these columns. No Qt here."""

from __future__ import annotations

import sqlite3

SCHEMA_V1 = (
    """CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS messages (
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
)""",
    "CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id)",
)
TREE_COLUMNS = {"conversations": ("active_root",), "messages": ("parent_id", "active_child")}  # version 3
COLUMNS = {
    "conversations": ("id", "title", "created_at", "updated_at"),
    "messages": (
        "id",
        "conversation_id",
        "role",
        "content",
        "status",
        "model",
        "stats",
        "draft_spans",
        "notice",
        "created_at",
    ),
}


def _v1_first_schema(db: sqlite3.Connection) -> None:
    for statement in SCHEMA_V1:  # IF NOT EXISTS: files from before versions were recorded have these
        db.execute(statement)


def _v2_conversation_settings(db: sqlite3.Connection) -> None:
    # JSON of the settings a conversation overrides (system prompt, sampling, preset); NULL = the defaults.
    db.execute("ALTER TABLE conversations ADD COLUMN settings TEXT")


def _v3_message_tree(db: sqlite3.Connection) -> None:
    # Messages form a tree: a regenerated answer or an edited question is a sibling of the one it replaces,
    # which stays. active_child (a conversation's active_root for its first messages) is the branch shown;
    # NULL, or a child that is gone, means the newest. A linear conversation becomes a chain.
    db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE")
    db.execute("ALTER TABLE messages ADD COLUMN active_child INTEGER")
    db.execute("ALTER TABLE conversations ADD COLUMN active_root INTEGER")
    db.execute(
        "UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p "
        "WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id)"
    )
    db.execute("CREATE INDEX messages_by_parent ON messages(parent_id)")


# Step i takes a file from schema version i to i + 1 (PRAGMA user_version). A later change appends a step;
# a released step is never edited.
MIGRATIONS = [_v1_first_schema, _v2_conversation_settings, _v3_message_tree]
SCHEMA_VERSION = len(MIGRATIONS)


class NewerSchemaError(Exception):
    """The file was written by a newer SpecChat: this one must not change it."""

    def __init__(self, version: int):
        super().__init__(f"schema version {version}; this SpecChat knows up to {SCHEMA_VERSION}")
        self.version = version
