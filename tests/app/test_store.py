"""Saved conversations: SQLite in WAL mode in the data dir; nothing saved is ever lost."""

import sqlite3

import pytest

from app.conversations.store import SCHEMA_VERSION, ConversationStore, Message, default_path, open_store


def test_conversations_survive_reopening(dirs):
    store, notices = open_store()
    assert default_path().parent == dirs / "data" and notices == []
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    a = store.create_conversation("First")
    b = store.create_conversation("Second")
    store.add_message(a, Message(None, "user", "hello"))
    reply = Message(
        None, "assistant", "hi **there**", model="M", stats={"tokens_per_s": 12.5, "drafted": 3}, draft_spans=[[0, 2]]
    )
    store.add_message(a, reply)
    store.add_message(b, Message(None, "user", "other"))
    store.close()

    store = ConversationStore(default_path())
    assert {c.title for c in store.conversations()} == {"First", "Second"}
    msgs = store.messages(a)
    assert [(m.role, m.content) for m in msgs] == [("user", "hello"), ("assistant", "hi **there**")]
    assert msgs[1].stats == {"tokens_per_s": 12.5, "drafted": 3} and msgs[1].draft_spans == [[0, 2]]
    assert msgs[1].model == "M" and msgs[1].status == "done"


def test_streaming_message_left_behind_is_marked_interrupted(dirs):
    store, _ = open_store()
    cid = store.create_conversation()
    m = Message(None, "assistant", "partial text", status="streaming")
    store.add_message(cid, m)
    store.db.close()  # as if killed: no clean shutdown
    store, notices = open_store()
    assert store.messages(cid)[0].status == "interrupted"
    assert store.messages(cid)[0].content == "partial text"
    assert "cut off" in notices[0]


def test_search_rename_delete(dirs):
    store, _ = open_store()
    a = store.create_conversation("Baking")
    b = store.create_conversation("Travel")
    store.add_message(b, Message(None, "user", "Best 100% pure sourdough?"))
    assert [c.id for c in store.conversations("bak")] == [a]
    assert [c.id for c in store.conversations("sourdough")] == [b]
    assert [c.id for c in store.conversations("100%")] == [b]  # LIKE wildcards are matched literally
    assert store.conversations("0_p") == []
    store.rename(a, "  Bread  ")
    assert store.conversation(a).title == "Bread"
    store.delete_conversation(b)
    assert store.conversation(b) is None and store.messages(b) == []


def test_unreadable_file_is_kept_aside_and_a_new_one_started(dirs):
    path = default_path()
    path.write_bytes(b"this is not an sqlite database" * 100)
    store, notices = open_store()
    assert "could not be read" in notices[0]
    kept = list(path.parent.glob("conversations.unreadable-*"))
    assert kept and kept[0].read_bytes().startswith(b"this is not")
    assert store.conversations() == []
    store.create_conversation("fresh")
    assert sqlite3.connect(path).execute("SELECT title FROM conversations").fetchall() == [("fresh",)]


def test_an_unusable_data_folder_keeps_conversations_in_memory_and_says_so(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(blocker / "data"))  # mkdir fails: NotADirectoryError
    store, notices = open_store()
    assert len(notices) == 1
    assert notices[0].startswith(f"Conversations will not be saved: {blocker / 'data'} is not writable (")
    cid = store.create_conversation("still works")
    store.add_message(cid, Message(None, "user", "hello"))
    assert [m.content for m in store.messages(cid)] == ["hello"]
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("journal, readable", [("wal", True), ("delete", False)])
def test_a_file_locked_by_another_program_is_never_set_aside(dirs, monkeypatch, journal, readable):
    import app.conversations.store

    monkeypatch.setattr(
        app.conversations.store, "BUSY_TIMEOUT_S", 0.3, raising=False
    )  # the real wait is longer; same outcome
    store, _ = open_store()
    store.add_message(store.create_conversation("Mine"), Message(None, "user", "keep me"))
    store.close()
    path = default_path()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute(f"PRAGMA journal_mode={journal}")  # in rollback mode a writer blocks readers too
    other.execute("BEGIN EXCLUSIVE")  # another program writing, for longer than SpecChat waits
    try:
        store, notices = open_store()
        assert len(notices) == 1 and f"{path} is in use by another program" in notices[0]
        assert [c.title for c in store.conversations()] == (["Mine"] if readable else [])  # a copy, if it can
        assert ("shown from a copy" in notices[0]) == readable
        store.create_conversation("not saved there")
        store.close()
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert [p.name for p in path.parent.iterdir() if not p.name.startswith("conversations.sqlite3")] == []
    assert [r[0] for r in sqlite3.connect(path).execute("SELECT title FROM conversations")] == ["Mine"]
    store, notices = open_store()  # once the other program is done, all is as before
    assert notices == [] and [c.title for c in store.conversations()] == ["Mine"]


def _damage_a_page(path, btree):
    """Overwrite one leaf page in the middle of this table or index with garbage, as a bad disk sector would."""
    db = sqlite3.connect(path)
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    leaves = [
        r[0] for r in db.execute("SELECT pageno FROM dbstat WHERE name=? AND pagetype='leaf' ORDER BY pageno", (btree,))
    ]
    db.close()
    page = leaves[len(leaves) // 2]
    with open(path, "r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(b"\xa5" * page_size)
    return len(leaves)


# A damaged index is only met when a conversation is opened; a damaged table page loses the rows on it.
@pytest.mark.parametrize("btree", ["messages", "messages_by_conversation"])
def test_a_damaged_page_is_noticed_at_open_kept_aside_and_the_rest_salvaged(dirs, btree):
    store, _ = open_store()
    ids = []
    for c in range(5):
        cid = store.create_conversation(f"Chat {c}")
        ids.append(cid)
        store.set_conversation_settings(cid, {"preset": "Precise", "temperature": 0.1 * c})
        for i in range(60):
            store.add_message(cid, Message(None, "user", f"message {c}.{i} " + "words " * 40))
    store.close()
    path = default_path()
    assert _damage_a_page(path, btree) > (10 if btree == "messages" else 0)
    original = path.read_bytes()

    store, notices = open_store()
    kept = list(path.parent.glob("conversations.unreadable-*.sqlite3"))
    assert len(kept) == 1 and kept[0].read_bytes() == original  # the old file, untouched
    assert len(notices) == 1 and "malformed" in notices[0] and kept[0].name in notices[0]
    assert sqlite3.connect(path).execute("PRAGMA quick_check").fetchone()[0] == "ok"
    assert [c.title for c in store.conversations()] == [f"Chat {c}" for c in reversed(range(5))]
    saved = sum(len(store.messages(cid)) for cid in ids)  # every conversation reads without an error
    assert 250 < saved < 300 if btree == "messages" else saved == 300  # all but those on the damaged page
    assert f"{saved} of 300 messages were recovered" in notices[0]
    assert [store.conversation_settings(cid) for cid in ids] == [  # each chat keeps its own settings
        {"preset": "Precise", "temperature": 0.1 * c} for c in range(5)
    ]


def test_a_database_from_a_newer_version_is_left_untouched(dirs):
    store, _ = open_store()
    store.create_conversation("From the future")
    store.close()
    path = default_path()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    before = path.read_bytes()
    store, notices = open_store()
    assert len(notices) == 1 and "newer version of SpecChat" in notices[0] and str(path) in notices[0]
    assert store.conversations() == []
    store.create_conversation("this session only")
    store.close()
    assert path.read_bytes() == before and list(path.parent.glob("conversations*")) == [path]


def test_schema_version_is_recorded_and_an_unversioned_file_is_upgraded(dirs):
    path = default_path()
    db = sqlite3.connect(path)  # a file from before versions were recorded: tables, user_version 0
    db.executescript(
        "CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, "
        "created_at REAL NOT NULL, updated_at REAL NOT NULL);"
        "INSERT INTO conversations VALUES (1, 'Old', 0, 0);"
    )
    db.close()
    store, notices = open_store()
    assert notices == [] and [c.title for c in store.conversations()] == ["Old"]
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # every step ran
    store.add_message(1, Message(None, "user", "hi"))
    assert store.messages(1)[0].content == "hi"
    assert store.conversation_settings(1) == {}  # version 2: per-conversation settings
    store.set_conversation_settings(1, {"system_prompt": "Be brief.", "temperature": 0.2})
    assert store.conversation_settings(1) == {"system_prompt": "Be brief.", "temperature": 0.2}
