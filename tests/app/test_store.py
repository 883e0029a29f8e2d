"""Saved conversations: SQLite in WAL mode in the data dir; nothing saved is ever lost."""
import sqlite3

from app.store import ConversationStore, Message, default_path, open_store


def test_conversations_survive_reopening(dirs):
    store, notices = open_store()
    assert default_path().parent == dirs / "data" and notices == []
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    a = store.create_conversation("First")
    b = store.create_conversation("Second")
    store.add_message(a, Message(None, "user", "hello"))
    reply = Message(None, "assistant", "hi **there**", model="M", stats={"tokens_per_s": 12.5, "drafted": 3},
                    draft_spans=[[0, 2]])
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
