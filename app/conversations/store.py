"""Saved conversations: SQLite in the user data dir, in WAL mode.

Every write is its own committed transaction, so a response saved while it streams survives a
crash or a kill of the app. A message still marked "streaming" when the store opens was cut off
by such a crash; it is marked "interrupted" and kept (only one SpecChat runs per data dir, see
single_instance.py, so no live response is ever mistaken for one). No Qt here; the GUI thread owns
the store.

open_store never loses a saved conversation: a damaged file is kept aside and what can be read is
copied into a new one; a file another program holds, a file from a newer SpecChat and a folder that
cannot be written are all left as they are, and the conversations of this session stay in memory.
"""

from __future__ import annotations

import enum
import json
import logging
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from app.conversations.salvage import salvage
from app.conversations.schema import MIGRATIONS, SCHEMA_VERSION, NewerSchemaError
from engine.paths import data_dir, unwritable_reason
from engine.text_rules import plain_name, valid_json, valid_text

log = logging.getLogger(__name__)

FILE_NAME = "conversations.sqlite3"
STATUSES = ("done", "streaming", "stopped", "error", "interrupted")
MEMORY = ":memory:"
BUSY_TIMEOUT_S = 5.0  # how long SQLite itself retries when another program holds the file
WRITE_WAIT_S = 0.01  # how long a write of the open store waits for the file (see __init__)


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
    draft_spans: list[list[Any]] = field(default_factory=list)  # [start, end] or [start, end, proposer]
    notice: str = ""
    parent_id: int | None = None  # the message this one follows; None for a first message


@dataclass
class MessageTree:
    """Every message of one conversation, every branch, and which branch is shown under each message."""

    messages: dict[int, Message]
    children: dict[int | None, list[int]]  # parent id (None: the first messages) -> child ids, oldest first
    chosen: dict[int | None, int]  # the child chosen under a parent, where one was

    def active_child(self, parent: int | None) -> int | None:
        kids = self.children.get(parent, [])
        choice = self.chosen.get(parent)
        return choice if choice in kids else (kids[-1] if kids else None)

    def path(self) -> list[Message]:
        """The branch shown: from the first message, the active child of each, to the end."""
        path: list[Message] = []
        node = self.active_child(None)
        while node is not None and len(path) < len(self.messages):  # a parent always precedes its children
            path.append(self.messages[node])
            node = self.active_child(node)
        return path

    def siblings(self, message: Message) -> list[int]:
        """Ids of the messages that answer the same parent as this one (itself included), oldest first."""
        assert message.id is not None  # a message of the tree: saved
        return self.children.get(message.parent_id, [message.id])


class _Default(enum.Enum):
    END = "end"


_END: Final = _Default.END  # add_message's default parent: the last message of the branch shown


def _row_id(cursor: sqlite3.Cursor) -> int:
    """The id an INSERT gave its row (sqlite3 types lastrowid as optional: None before any INSERT)."""
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def default_path() -> Path:
    return data_dir() / FILE_NAME


class ConversationStore:
    def __init__(self, path: Path | str | None = None):
        """Open (or create) the file and bring its schema up to date. Raises sqlite3.DatabaseError
        (damaged, locked, unwritable) or NewerSchemaError, having written nothing in those cases."""
        self.path = path if path == MEMORY else Path(path or default_path())
        if isinstance(self.path, Path):  # not MEMORY
            _make_private_file(self.path)
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_S)  # autocommit
        try:
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise NewerSchemaError(version)
            problem = self.db.execute("PRAGMA quick_check(1)").fetchone()[0]  # reads every page once
            if problem != "ok":
                log.warning("%s failed its integrity check: %s", self.path, problem)
                raise sqlite3.DatabaseError("database disk image is malformed")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a killed app loses no committed write
            self.db.execute("PRAGMA foreign_keys=ON")
            self._migrate(version)
            self.recovered = self.mark_interrupted()
            # Opened, the store is the GUI thread's: a write that finds the file held (an import being stored
            # holds it for seconds) fails at once instead of freezing the window; the session retries it.
            self.db.execute(f"PRAGMA busy_timeout={int(WRITE_WAIT_S * 1000)}")
        except BaseException:
            self.db.close()
            raise

    def mark_interrupted(self) -> int:
        """Responses left "streaming" by a crash are "interrupted": how many there were."""
        return self.db.execute("UPDATE messages SET status='interrupted' WHERE status='streaming'").rowcount

    def _migrate(self, version: int) -> None:
        for step in range(version, SCHEMA_VERSION):
            self.db.execute("BEGIN IMMEDIATE")
            try:
                MIGRATIONS[step](self.db)
                self.db.execute(f"PRAGMA user_version = {step + 1}")
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    # --- conversations ------------------------------------------------------------------------
    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; with search, those whose title or any message contains it."""
        if search:
            pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self.db.execute(
                "SELECT id, title, updated_at FROM conversations c WHERE title LIKE ?1 ESCAPE '\\' OR EXISTS "
                "(SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.content LIKE ?1 ESCAPE '\\') "
                "ORDER BY updated_at DESC, id DESC",
                (pattern,),
            )
        else:
            rows = self.db.execute("SELECT id, title, updated_at FROM conversations ORDER BY updated_at DESC, id DESC")
        return [Conversation(*r) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute(
            "SELECT id, title, updated_at FROM conversations WHERE id=?", (conversation_id,)
        ).fetchone()
        return Conversation(*row) if row else None

    def create_conversation(self, title: str = "New chat") -> int:
        now = time.time()
        return _row_id(
            self.db.execute(
                "INSERT INTO conversations(title, created_at, updated_at) VALUES (?, ?, ?)", (_title(title), now, now)
            )
        )

    def rename(self, conversation_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title=? WHERE id=?", (_title(title), conversation_id))

    def conversation_settings(self, conversation_id: int) -> dict:
        """What this conversation overrides of the app's settings ({} = nothing)."""
        row = self.db.execute("SELECT settings FROM conversations WHERE id=?", (conversation_id,)).fetchone()
        value = _load(row[0], {}) if row else {}
        return value if isinstance(value, dict) else {}

    def set_conversation_settings(self, conversation_id: int, settings: dict) -> None:
        self.db.execute(
            "UPDATE conversations SET settings=? WHERE id=?", (_dump(settings) if settings else None, conversation_id)
        )

    def delete_conversation(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def touch(self, conversation_id: int) -> None:
        self.db.execute("UPDATE conversations SET updated_at=? WHERE id=?", (time.time(), conversation_id))

    # --- messages -----------------------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        """The branch shown, first message first."""
        return self.tree(conversation_id).path()

    def tree(self, conversation_id: int) -> MessageTree:
        rows = self.db.execute(
            "SELECT id, role, content, status, model, stats, draft_spans, notice, parent_id, active_child "
            "FROM messages WHERE conversation_id=? ORDER BY id",
            (conversation_id,),
        )
        tree = MessageTree({}, {}, {})
        for r in rows:
            tree.messages[r[0]] = Message(
                id=r[0],
                role=r[1],
                content=r[2],
                status=r[3],
                model=r[4],
                stats=_load(r[5], None),
                draft_spans=_load(r[6], []),
                notice=r[7],
                parent_id=r[8],
            )
            tree.children.setdefault(r[8], []).append(r[0])
            if r[9] is not None:
                tree.chosen[r[0]] = r[9]
        root = self.db.execute("SELECT active_root FROM conversations WHERE id=?", (conversation_id,)).fetchone()
        if root and root[0] is not None:
            tree.chosen[None] = root[0]
        return tree

    def add_message(self, conversation_id: int, message: Message, parent: int | None | _Default = _END) -> int:
        """Save message as the next after parent (None: a first message; by default after the last message
        shown), and show its branch."""
        if parent is _END:
            shown = self.messages(conversation_id)
            parent = shown[-1].id if shown else None
        message.parent_id = parent
        message.id = new_id = _row_id(
            self.db.execute(
                "INSERT INTO messages(conversation_id, role, content, status, model, stats, draft_spans, notice, "
                "created_at, parent_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, message.role, *_texts(message), time.time(), parent),
            )
        )
        self._choose(conversation_id, parent, new_id)
        self.touch(conversation_id)
        return new_id

    def set_active(self, message_id: int) -> None:
        """Show the branch through this message (below it, the branch last shown there)."""
        row = self.db.execute("SELECT conversation_id, parent_id FROM messages WHERE id=?", (message_id,)).fetchone()
        if row:
            self._choose(row[0], row[1], message_id)

    def _choose(self, conversation_id: int, parent: int | None, child: int) -> None:
        if parent is None:
            self.db.execute("UPDATE conversations SET active_root=? WHERE id=?", (child, conversation_id))
        else:
            self.db.execute("UPDATE messages SET active_child=? WHERE id=?", (child, parent))

    @contextmanager
    def transaction(self):
        """Writes inside happen all together or, if anything raises, not at all."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")  # may fail too (a full disk): then it is rolled back, never left open
        except BaseException:
            if self.db.in_transaction:  # SQLite may have rolled it back itself (a full disk, an I/O error)
                self.db.execute("ROLLBACK")
            raise

    def update_message(self, message: Message) -> None:
        self.db.execute(
            "UPDATE messages SET content=?, status=?, model=?, stats=?, draft_spans=?, notice=? WHERE id=?",
            (*_texts(message), message.id),
        )

    def close(self) -> None:
        self.db.close()


def _title(title: str) -> str:
    # A title names a conversation: one line, no bidi control or invisible character (engine.text_rules).
    return plain_name(title) or "Untitled"


def _texts(message: Message) -> tuple:
    """The message's columns from content to notice, each valid text: a lone surrogate (a remote answer or an
    imported chat can hold one) would make SQLite's UTF-8 encode raise, and the answer would be lost."""
    return (
        valid_text(message.content),
        message.status,
        plain_name(message.model),
        _dump(message.stats),
        _dump(message.draft_spans),
        valid_text(message.notice),
    )


def _dump(value) -> str | None:
    return None if value is None else json.dumps(valid_json(value), separators=(",", ":"))


def _load(text: str | None, default):
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def open_store(path: Path | None = None) -> tuple[ConversationStore, list[str]]:
    """The store, and notices for the user. Whatever goes wrong, a store comes back (in memory if need
    be) and no saved conversation is lost: files are only ever kept aside, never deleted."""
    path = Path(path) if path else data_dir() / FILE_NAME
    reason = unwritable_reason(path.parent)
    if reason:
        store, shown = _copy_in_memory(path)
        return store, [
            f"Conversations will not be saved: {path.parent} is not writable ({reason}). {shown}What "
            "you write now lasts until you quit; make that folder writable (or set SPECCHAT_DATA_DIR "
            "to one that is) and restart SpecChat."
        ]
    try:
        store = ConversationStore(path)
    except NewerSchemaError as exc:
        return ConversationStore(MEMORY), [
            f"The conversation file {path} was written by a newer version of SpecChat ({exc}), so it was left "
            "untouched and its conversations are not shown. Conversations will not be saved; that newer "
            "version still has them all."
        ]
    except sqlite3.DatabaseError as exc:
        if _is_damaged(exc):
            return _start_over(path, exc)
        store, shown = _copy_in_memory(path)
        if _is_busy(exc):
            return store, [
                f"The conversation file {path} is in use by another program, so SpecChat cannot save "
                f"to it. {shown}Conversations will not be saved until you close that program and "
                "restart SpecChat. Nothing was moved or changed."
            ]
        return store, [
            f"Conversations will not be saved: {path} cannot be written ({exc}). {shown}Nothing was moved or changed."
        ]
    notices = []
    if store.recovered:
        notices.append(
            f"{store.recovered} response{'s were' if store.recovered != 1 else ' was'} cut off when "
            "SpecChat last closed unexpectedly; the text saved up to then is kept, marked interrupted."
        )
    return store, notices


def _make_private_file(path: Path) -> None:
    """The database file created readable by its owner alone (engine.paths.PRIVATE_FILE) before SQLite opens it:
    SQLite gives its -wal and -shm the same mode. Those an older version made readable by others are tightened."""
    import os  # (here: this function is the permissions' part of this module)

    from engine.paths import PRIVATE_FILE, make_private

    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))  # an empty file: a new database
    except OSError:
        pass  # there already, or not creatable: SQLite opens it or says why
    for suffix in ("", "-wal", "-shm"):
        make_private(Path(str(path) + suffix))


def is_busy(exc: BaseException) -> bool:
    """Whether exc says another connection holds the file (it is free again soon)."""
    return isinstance(exc, sqlite3.Error) and _is_busy(exc)


def _is_busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc)


def _is_damaged(exc: sqlite3.Error) -> bool:
    """A file SQLite cannot read as a database, as opposed to one it cannot reach (locked, read-only, full)."""
    return getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or any(
        words in str(exc) for words in ("malformed", "not a database")
    )


def _copy_in_memory(path: Path) -> tuple[ConversationStore, str]:
    """An in-memory store with what the file holds, if it can be read at all (else empty), and a sentence
    saying so for a notice."""
    store = ConversationStore(MEMORY)
    if not path.is_file():
        return store, ""
    try:
        source = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            version = source.execute("PRAGMA user_version").fetchone()[0]
            if version <= SCHEMA_VERSION:
                source.backup(store.db)
                store._migrate(version)  # in memory only: the file stays as it is
                store.mark_interrupted()
        finally:
            source.close()
    except sqlite3.Error:
        pass  # locked for reading too, or unreadable: the session starts empty
    return store, "Your saved conversations are shown from a copy. " if store.conversations() else ""


def _start_over(path: Path, exc: sqlite3.DatabaseError) -> tuple[ConversationStore, list[str]]:
    """Keep the damaged file aside, start a new one and copy into it every row that can still be read."""
    kept = path.with_name(f"{path.stem}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}{path.suffix}")
    try:
        for suffix in ("", "-wal", "-shm"):  # the WAL holds the newest writes: it goes with its file
            side = Path(str(path) + suffix)
            if side.exists():
                side.replace(Path(str(kept) + suffix))
        store = ConversationStore(path)
    except (OSError, sqlite3.Error) as error:
        return ConversationStore(MEMORY), [
            f"The conversation file {path} could not be read ({exc}), and a new one could not be started "
            f"({error}). Conversations will not be saved; the files were left where they are."
        ]
    saved, found = salvage(kept, store.db)
    store.mark_interrupted()
    what = (
        f"{saved} of {found} messages were recovered into a new file"
        if found
        else "nothing in it could be read, so a new one was started"
    )
    return store, [
        f"The conversation file could not be read ({exc}); {what}. The old file is kept, unchanged, "
        f"as {kept.name} in {kept.parent}."
    ]
