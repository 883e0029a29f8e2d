"""Export and import: Markdown holds the branch shown, readable; JSON holds everything and imports back
to the same conversation; a bad file is refused with a clear message and adds nothing."""

import json
from dataclasses import replace

import pytest

from app.conversations import files as conversation_io
from app.conversations.files import ConversationFileError, export_json, export_markdown, import_json, markdown
from app.conversations.store import ConversationStore, Message

STATS = {
    "tokens_per_s": 41.5,
    "ttft_s": 0.12,
    "drafted": 10,
    "accepted": 7,
    "acceptance_rate": 0.7,
    "mean_acceptance_length": 1.7,
    "method": "lookup",
    "backend": "CPU",
    "memory_label": "RAM 310 MB",
    "finish_reason": "length",
    "generated": 12,
    "rate_history": [[0.1, 40.0], [0.2, 41.5]],
    "per_position_acceptance": [0.9, 0.5],
    "speculation_paused": False,
}


def branched(store: ConversationStore) -> int:
    """Two questions at the start (the first was edited), answers regenerated, the old branch shown."""
    cid = store.create_conversation("Colours and *fruit*")
    store.set_conversation_settings(cid, {"preset": "Precise", "temperature": 0.2, "system_prompt": "Be brief."})
    q1 = store.add_message(cid, Message(None, "user", "Name a colour."), parent=None)
    a1 = store.add_message(
        cid, Message(None, "assistant", "Red.", model="gemma-3-270m", stats=STATS, draft_spans=[[0, 3]]), parent=q1
    )
    store.add_message(
        cid,
        Message(None, "assistant", "Blue, **surely**.", model="gemma-3-270m", stats={**STATS, "finish_reason": "stop"}),
        parent=q1,
    )
    q2 = store.add_message(cid, Message(None, "user", "And another?"), parent=a1)
    store.add_message(
        cid,
        Message(
            None, "assistant", "Green", status="stopped", model="smollm2", notice="Stopped because the app was closed."
        ),
        parent=q2,
    )
    edited = store.add_message(cid, Message(None, "user", "Name a fruit."), parent=None)
    store.add_message(cid, Message(None, "assistant", "A pear.", model="gemma-3-270m"), parent=edited)
    store.set_active(q1)  # the first question's branch, and under it the first answer
    store.set_active(a1)
    return cid


def shape(store: ConversationStore, cid: int):
    """The conversation as nested plain data: what must survive export and import, ids aside."""
    tree = store.tree(cid)

    def node(mid):
        m = tree.messages[mid]
        kids = tree.children.get(mid, [])
        return {
            "role": m.role,
            "content": m.content,
            "status": m.status,
            "model": m.model,
            "stats": m.stats,
            "spans": m.draft_spans,
            "notice": m.notice,
            "shown": kids.index(tree.active_child(mid)) if kids else None,
            "children": [node(k) for k in kids],
        }

    roots = tree.children.get(None, [])
    return {
        "title": store.conversation(cid).title,
        "settings": store.conversation_settings(cid),
        "shown": roots.index(tree.active_child(None)) if roots else None,
        "roots": [node(r) for r in roots],
    }


@pytest.fixture
def store(tmp_path):
    s = ConversationStore(tmp_path / "conversations.sqlite3")
    yield s
    s.close()


def test_a_json_export_imports_back_to_the_same_conversation(store, tmp_path):
    cid = branched(store)
    export_json(store, cid, tmp_path / "chat.json")
    data = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))
    assert data["format"] == "specchat-conversation" and data["version"] == 1
    assert len(data["messages"]) == 7 and data["settings"]["temperature"] == 0.2

    other = ConversationStore(tmp_path / "elsewhere.sqlite3")  # as on another machine
    new = import_json(other, tmp_path / "chat.json", keep_sent=True)  # its preset and system prompt, as if asked
    assert shape(other, new) == {**shape(store, cid), "title": "Colours and *fruit* (imported)"}
    assert [m.content for m in other.messages(new)] == ["Name a colour.", "Red.", "And another?", "Green"]
    again = import_json(store, tmp_path / "chat.json")  # into the same store: a second, separate copy
    assert again != cid
    # Not asked: what it says about what is sent (the preset, the system prompt) is dropped; sampling stays.
    assert shape(store, again) == {
        **shape(store, cid),
        "title": "Colours and *fruit* (imported)",
        "settings": {"temperature": 0.2},
    }
    other.close()


def test_markdown_holds_every_turn_of_the_branch_shown_with_the_stats(store, tmp_path):
    cid = branched(store)
    export_markdown(store, cid, tmp_path / "chat.md")
    text = (tmp_path / "chat.md").read_text(encoding="utf-8")
    assert text.startswith("# Colours and *fruit*\n")
    turns = [
        "## You\n\nName a colour.",
        "## Assistant · gemma-3-270m\n\nRed.",
        "## You\n\nAnd another?",
        "## Assistant · smollm2\n\nGreen",
    ]
    positions = [text.index(t) for t in turns]
    assert positions == sorted(positions)  # in order
    assert "41.5 tok/s" in text and "accepted 70% (7/10)" in text and "stopped at the length limit" in text
    assert "Stopped because the app was closed." in text
    assert "Blue" not in text and "pear" not in text  # other branches are in the JSON export
    assert "JSON export holds every version" in text
    assert markdown(store, cid).count("## ") == 4


def good(store, tmp_path) -> dict:
    cid = branched(store)
    export_json(store, cid, tmp_path / "good.json")
    return json.loads((tmp_path / "good.json").read_text(encoding="utf-8"))


def spoil(data: dict, how: str) -> dict | list | str:
    data = json.loads(json.dumps(data))
    m = data["messages"]
    if how == "not an export":
        return {"title": "x", "messages": []}
    if how == "newer version":
        data["version"] = 2
    elif how == "a list":
        return [data]
    elif how == "parent after child":
        m[1]["parent"] = 7
    elif how == "own parent":
        m[0]["parent"] = m[0]["id"]
    elif how == "duplicate id":
        m[2]["id"] = m[1]["id"]
    elif how == "bad role":
        m[3]["role"] = "tool"
    elif how == "content not text":
        m[1]["content"] = {"text": "Red."}
    elif how == "span outside text":
        m[1]["draft_spans"] = [[0, 999]]
    elif how == "stats figure of the wrong kind":
        m[1]["stats"]["tokens_per_s"] = "fast"
    elif how == "shown child not a child":
        m[0]["active_child"] = m[4]["id"]
    elif how == "bad setting":
        data["settings"]["temperature"] = 99
    elif how == "status unknown":
        m[4]["status"] = "great"
    elif how == "a bad last message":  # everything before it is fine: still nothing may be added
        m[-1]["content"] = None
    return data


BAD = [
    "not an export",
    "newer version",
    "a list",
    "parent after child",
    "own parent",
    "duplicate id",
    "bad role",
    "content not text",
    "span outside text",
    "stats figure of the wrong kind",
    "shown child not a child",
    "bad setting",
    "status unknown",
    "a bad last message",
]
MESSAGES = {
    "not an export": "not a SpecChat conversation export",
    "newer version": "newer SpecChat",
    "a list": "not a SpecChat conversation export",
    "parent after child": "does not come before it",
    "own parent": "does not come before it",
    "duplicate id": "no other message has",
    "bad role": "role 'tool'",
    "content not text": "content as text",
    "span outside text": "draft spans",
    "stats figure of the wrong kind": "'tokens_per_s'",
    "shown child not a child": "does not answer it",
    "bad setting": "temperature must be",
    "status unknown": "status 'great'",
    "a bad last message": "message 7",
}


@pytest.mark.parametrize("how", BAD)
def test_a_malformed_file_is_refused_and_nothing_is_added(store, tmp_path, how):
    data = spoil(good(store, tmp_path), how)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    before = [c.id for c in store.conversations()]
    count = store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    with pytest.raises(ConversationFileError) as refused:
        import_json(store, path)
    assert str(refused.value).startswith("bad.json ") and MESSAGES[how] in str(refused.value)
    assert [c.id for c in store.conversations()] == before
    assert store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == count


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"{not json", "is not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
        (b"\xff\xfe\x00garbage", "is not a text file in UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_a_file_that_is_not_json_is_refused_clearly(store, tmp_path, content, expected):
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    with pytest.raises(ConversationFileError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        import_json(store, path)
    assert store.conversations() == []


def test_a_file_too_large_is_refused_before_it_is_read(store, tmp_path, monkeypatch):
    monkeypatch.setattr(conversation_io, "MAX_FILE_BYTES", 1024)  # the real limit is 64 MB: same check
    path = tmp_path / "big.json"
    path.write_text(json.dumps(good(store, tmp_path)) + " " * 2048, encoding="utf-8")
    before = store.conversations()
    with pytest.raises(ConversationFileError, match="can be at most 0 MB"):
        import_json(store, path)
    assert store.conversations() == before


def test_a_failure_while_saving_leaves_no_half_conversation(store, tmp_path, monkeypatch):
    data = good(store, tmp_path)
    before = store.conversations()
    count = store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    real, calls = store.add_message, []

    def fail_on_the_fourth(*args, **kwargs):  # a full disk midway: SQLite raises, as it would
        calls.append(1)
        if len(calls) == 4:
            raise __import__("sqlite3").OperationalError("database or disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "add_message", fail_on_the_fourth)
    with pytest.raises(Exception, match="disk is full"):
        import_json(store, tmp_path / "good.json")
    assert len(calls) == 4 and len(data["messages"]) == 7
    assert store.conversations() == before
    assert store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == count


def test_every_stats_figure_the_app_saves_has_a_known_kind():
    from app.progress import snapshot
    from engine.decoding.stats import GenerationStats
    from engine.remote.answer_stream import RemoteFigures

    known = (
        conversation_io.STATS_NUMBERS
        | conversation_io.STATS_TEXTS
        | conversation_io.STATS_FLAGS
        | conversation_io.STATS_NUMBER_LISTS
        | conversation_io.STATS_PAIR_LISTS
        | conversation_io.STATS_COUNTS
    )
    assert set(snapshot(GenerationStats())) - known == set()
    remote = RemoteFigures(backend="remote example.org", model="m", drafted=3, accepted=2).to_dict()
    assert set(remote) - known == set()


# --- through the window ---------------------------------------------------------------------
@pytest.mark.slow
def test_the_window_exports_and_imports_a_real_conversation(
    make_window, qtbot, wait_response, quick_settings, tmp_path
):
    window = make_window(replace(quick_settings, max_tokens=8))
    window.session.send("Name a colour.")
    wait_response(window)
    window.session.regenerate()
    answer = wait_response(window)
    cid = window.session.conversation_id
    assert window.files.export_conversation(tmp_path / "chat.json")
    assert window.files.export_conversation(tmp_path / "chat.md")
    assert f"{answer.stats['tokens_per_s']:.1f} tok/s" in (tmp_path / "chat.md").read_text(encoding="utf-8")

    new = window.files.import_conversation(tmp_path / "chat.json")
    assert new is not None and new != cid and window.session.conversation_id == new
    assert window.panel.current_id() == new and len(window.panel.model.rows) == 2
    assert shape(window.store, new) == {
        **shape(window.store, cid),
        "title": window.store.conversation(cid).title + " (imported)",
    }
    assert window.view.widget_for(1).branches.position.text() == "2 / 2"

    (tmp_path / "bad.json").write_text('{"format": "specchat-conversation", "version": 1, "messages": 3}')
    assert window.files.import_conversation(tmp_path / "bad.json") is None
    assert len(window.panel.model.rows) == 2 and window.session.conversation_id == new
    shown = [n.label.text() for n in window.notices.notices]
    assert any("bad.json was not imported: it has no list of messages." in text for text in shown)
