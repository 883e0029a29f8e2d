"""A disk that fills while an answer is written (issue 51, item 8): one notice says the answer is not saved yet,
the answer goes on in the window and ends as usual (Send, not Stop), it is saved once there is space again, and
closing with it unsaved asks instead of raising. Nothing saved before is touched.

The full disk is the store's own connection with a switch: while it is on, every write fails with the error
SQLite raises on a full disk (SQLITE_FULL, made by SQLite itself), as every write did in the report."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
from dataclasses import replace

import pytest
from PySide6.QtWidgets import QMessageBox

import app.chat.response as response_module
import app.chat.unsaved as unsaved_module
from app.conversations import held_answers
from app.conversations import store as store_module
from app.conversations.store import Message, default_path, open_store

from support.window import PASSAGE

WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def sqlite_full() -> sqlite3.OperationalError:
    """SQLite's own full-disk error: a database that may not grow past two pages is asked to."""
    db = sqlite3.connect(":memory:")
    try:
        db.execute("PRAGMA max_page_count=2")
        db.execute("CREATE TABLE t(x)")
        db.execute("INSERT INTO t VALUES (zeroblob(100000))")
    except sqlite3.OperationalError as exc:
        assert exc.sqlite_errorname == "SQLITE_FULL"
        return exc
    finally:
        db.close()
    raise AssertionError("SQLite wrote past max_page_count")


class FullDisk:
    """Stands in for the store's connection: reads go through; while full, writes fail as on a full disk."""

    def __init__(self, db: sqlite3.Connection):
        self.db, self.full, self.refused = db, False, 0

    @classmethod
    def under(cls, store) -> FullDisk:
        store.db = disk = cls(store.db)
        return disk

    def execute(self, sql: str, *args):
        if self.full and sql.lstrip().upper().startswith(WRITES):
            self.refused += 1
            raise sqlite_full()
        return self.db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.db, name)


def count_unhandled() -> list[str]:
    """Every exception that reaches sys.excepthook (one raised in a slot or in closeEvent), passed on as before.
    Installed in the test's body: pytest-qt sets its own hook for each phase of a test."""
    seen, before = [], sys.excepthook

    def hook(kind, value, tb):
        seen.append(f"{kind.__name__}: {value}")
        before(kind, value, tb)

    sys.excepthook = hook
    return seen


def answer_close_questions(monkeypatch, answer=QMessageBox.StandardButton.Yes) -> list[str]:
    """The window's questions get `answer` instead of waiting for a click that never comes (pytest-qt closes the
    windows before any fixture's teardown, maybe with the disk still full): the texts asked."""
    asked = []
    monkeypatch.setattr(
        QMessageBox, "question", staticmethod(lambda parent, title, text, *a: asked.append(text) or answer)
    )
    return asked


def fill_mid_answer(window, disk: FullDisk, after: int = 2) -> None:
    """The disk fills once the answer has shown text `after` times (the first of them saved: SAVE_EVERY_S is 0)."""
    steps = []

    def step(*_):
        streaming = window.session.streaming
        if streaming is not None and streaming.content and len(steps) < after:  # once: later answers are not
            steps.append(len(streaming.content))
            disk.full = len(steps) == after

    window.session.model.dataChanged.connect(step)  # in _progress, after the text is added, before the save


def saved_rows(conversation_id: int | None = None) -> list[tuple]:
    """(id, role, content, status) of the messages in the file, read as another program would."""
    db = sqlite3.connect(f"{default_path().resolve().as_uri()}?mode=ro", uri=True)
    try:
        where, args = ("WHERE conversation_id=?", (conversation_id,)) if conversation_id is not None else ("", ())
        return db.execute(f"SELECT id, role, content, status FROM messages {where} ORDER BY id", args).fetchall()
    finally:
        db.close()


def unsaved_notices(window) -> list:
    return [n for n in window.notices.notices if "not saved" in n.text]


def answer_with_full_disk(window, qtbot, disk: FullDisk, text: str = PASSAGE) -> tuple[object, list]:
    """Send text, fill the disk mid-answer, wait for the answer's end: the answer, and (Send button text, busy)
    as the window was the moment it ended."""
    ended = []
    window.session.responseFinished.connect(
        lambda stats: ended.append((window.send_button.text(), window.session.busy))
    )
    fill_mid_answer(window, disk)
    window.input.setPlainText(text)
    window.send_message()
    qtbot.waitUntil(lambda: bool(ended), timeout=60_000)  # today: never (the end's save raised, Stop stayed)
    return window.session.model.items[-1], ended


@pytest.mark.slow
def test_an_answer_the_full_disk_refuses_is_kept_told_once_and_saved_when_there_is_space(
    make_window, quick_settings, qtbot, monkeypatch
):
    monkeypatch.setattr(response_module, "SAVE_EVERY_S", 0.0)  # a save at every step: many refused, one notice
    monkeypatch.setattr(unsaved_module, "RETRY_EVERY_S", 0.3)
    asked = answer_close_questions(monkeypatch)
    unhandled = count_unhandled()
    window = make_window(replace(quick_settings, max_tokens=48))
    disk = FullDisk.under(window.store)

    answer, ended = answer_with_full_disk(window, qtbot, disk)
    assert ended == [("Send", False)]  # idle the moment the answer ended
    assert disk.refused >= 3 and unhandled == []
    notices = unsaved_notices(window)
    assert len(notices) == 1 and notices[0].level == "error", window.notices.texts()
    assert notices[0].text.startswith("This answer is not saved yet: the disk is full (database or disk is full).")
    assert "free some space" in notices[0].text
    assert answer.status == "done" and len(answer.content.split()) >= 8
    shown = " ".join(window.view.widget_for(1).text.toPlainText().split())
    assert " ".join(answer.content.split()[-3:]).strip("*_`") in shown  # its end is in the window
    cid = window.session.conversation_id
    on_disk = saved_rows(cid)[-1]
    assert on_disk[0] == answer.id and on_disk[3] == "streaming"  # as far as the disk took it
    assert 0 < len(on_disk[2]) < len(answer.content) and answer.content.startswith(on_disk[2])

    window.input.setPlainText("And then?")  # sent while the disk is still full: refused, kept in the box
    window.send_message()
    assert not window.session.busy and window.input.toPlainText() == "And then?"
    assert any(t.startswith("Not sent: the disk is full") for t in window.notices.texts())
    assert [r[0] for r in saved_rows(cid)] == [m.id for m in window.session.model.items]  # nothing half-written
    window.open_conversation(cid)  # shown again: the answer from memory, not the file's older copy
    assert window.session.model.items[-1].content == answer.content

    disk.full = False  # space again: the next retry saves it, and the notice says so
    qtbot.waitUntil(lambda: not unsaved_notices(window), timeout=10_000)
    assert any(t.startswith("Saved now") for t in window.notices.texts())
    assert saved_rows(cid)[-1] == (answer.id, "assistant", answer.content, "done")
    window.send_message()  # the message kept in the box goes now
    qtbot.waitUntil(lambda: not window.session.busy, timeout=60_000)
    assert [r[2] for r in saved_rows(cid)][-2:] == ["And then?", window.session.model.items[-1].content]
    assert not any(t.startswith("Not sent") for t in window.notices.texts())  # sent: that notice went
    assert unhandled == [] and asked == []


def nowhere_to_keep(monkeypatch, tmp_path) -> None:
    """Every place held answers could be kept in is a folder under a file: none can be written."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(held_answers, "places", lambda: [blocker / "held.json"])


@pytest.mark.slow
def test_closing_with_an_answer_nothing_can_keep_asks_and_keeps_what_was_saved(
    make_window, quick_settings, qtbot, monkeypatch, wait_response, tmp_path
):
    from app.__main__ import _install_excepthook

    monkeypatch.setattr(response_module, "SAVE_EVERY_S", 0.0)
    nowhere_to_keep(monkeypatch, tmp_path)
    answer_close_questions(monkeypatch)
    unhandled = count_unhandled()
    window = make_window(quick_settings)
    window.input.setPlainText("Name three colours.")
    window.send_message()
    wait_response(window, timeout=60_000)
    before = saved_rows()  # a whole exchange, saved
    assert [r[1:] for r in before] == [(m.role, m.content, "done") for m in window.session.model.items]
    disk = FullDisk.under(window.store)

    answer, ended = answer_with_full_disk(window, qtbot, disk)
    assert ended == [("Send", False)] and answer.status == "done"

    # An unexpected error now must not claim the conversations are saved.
    counting = sys.excepthook
    _install_excepthook(window, smoke=False)
    app_hook, sys.excepthook = sys.excepthook, counting
    app_hook(ValueError, ValueError("a bug in a slot"), None)
    crash = [t for t in window.notices.texts() if t.startswith("Something went wrong")]
    assert len(crash) == 1 and "a bug in a slot" in crash[0]
    assert "conversations are saved" not in crash[0] and "not saved" in crash[0]

    asked = answer_close_questions(monkeypatch, QMessageBox.StandardButton.No)
    assert not window.close() and window.isVisible()  # No: the window stays as it was, the answer with it
    assert len(asked) == 1 and "not saved" in asked[0] and "Close anyway?" in asked[0]
    assert not window.session.busy and window.session.model.items[-1].content == answer.content
    asked = answer_close_questions(monkeypatch)
    assert window.close() and not window.isVisible()  # Yes: it closes, without raising
    assert len(asked) == 1 and unhandled == []

    after = saved_rows()
    assert after[: len(before)] == before  # what was saved before is intact
    assert [r[1:3] for r in after[len(before) :]][0] == ("user", PASSAGE)  # the question was saved
    assert answer.content.startswith(after[-1][2]) and len(after[-1][2]) < len(answer.content)


@pytest.mark.slow
def test_an_answer_still_refused_at_close_is_kept_and_saved_at_the_next_start(
    make_window, quick_settings, qtbot, monkeypatch
):
    """Closing with the disk still full: the answer goes to a file of its own (held_answers.py), the window closes
    without asking, and the next start puts the whole answer into its conversation, says so, and removes the file."""
    monkeypatch.setattr(response_module, "SAVE_EVERY_S", 0.0)
    asked = answer_close_questions(monkeypatch)
    unhandled = count_unhandled()
    window = make_window(replace(quick_settings, max_tokens=48))
    disk = FullDisk.under(window.store)
    answer, _ = answer_with_full_disk(window, qtbot, disk)
    cid = window.session.conversation_id
    assert answer.status == "done" and len(saved_rows(cid)[-1][2]) < len(answer.content)

    assert window.close() and not window.isVisible()
    assert asked == [] and unhandled == []
    kept = [p for p in held_answers.places() if p.exists()]
    assert len(kept) == 1 and kept[0].stat().st_mode & 0o077 == 0  # the user's alone

    store, notices = held_answers.open_store_with_held()  # the next start, as app/__main__.py opens it
    try:
        assert saved_rows(cid)[-1] == (answer.id, "assistant", answer.content, "done")
        assert any("saved in its conversation now" in n for n in notices), notices
        assert not kept[0].exists()
    finally:
        store.close()


def test_held_answers_in_a_file_another_user_could_write_are_not_read(dirs, monkeypatch):
    """The shared temporary folder is one of the places: a file there that others may write is left unread."""
    store, _ = open_store()
    cid = store.create_conversation("t")
    mid = store.add_message(cid, Message(id=None, role="assistant", content="kept", status="done"))
    store.close()
    place = held_answers.places()[0]
    place.write_text(
        json.dumps(
            {
                "format": held_answers.FORMAT,
                "answers": [
                    {
                        "conversation": cid,
                        "id": mid,
                        "content": "kept, and words put there by another user",
                        "status": "done",
                    }
                ],
            }
        )
    )
    place.chmod(0o666)
    store, notices = held_answers.open_store_with_held()
    try:
        assert store.messages(cid)[-1].content == "kept" and place.exists()
    finally:
        store.close()
    place.chmod(0o600)  # the same file, the user's alone: read, put in, removed
    store, notices = held_answers.open_store_with_held()
    try:
        assert store.messages(cid)[-1].content == "kept, and words put there by another user" and not place.exists()
    finally:
        store.close()


@pytest.mark.slow
def test_a_file_held_by_an_import_never_makes_the_window_wait_and_the_answer_is_saved_once_free(
    make_window, quick_settings, qtbot, monkeypatch, stall_probe
):
    """An import stores on its own thread and holds the file's write lock for seconds (a 60 MB chat: ~2 s here).
    The window's saves meanwhile fail at once (store.WRITE_WAIT_S) instead of waiting SQLite's 5 s: the answer
    streams and ends, one notice says the file is busy, and the retry saves it once the file is free. Here SQLite's
    own wait is made endless and the file is held until the test lets go (or a guard does, a minute on): a save
    that waited would hold the window until then, so the answer must end while the file is still held."""
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 3600.0)  # what a write without WRITE_WAIT_S would wait
    monkeypatch.setattr(response_module, "SAVE_EVERY_S", 0.0)
    monkeypatch.setattr(unsaved_module, "RETRY_EVERY_S", 0.3)
    window = make_window(replace(quick_settings, max_tokens=32))
    other = sqlite3.connect(default_path(), isolation_level=None, check_same_thread=False)  # as importing.ThreadStore
    started, let_go = [], threading.Lock()

    def free() -> bool:
        """End the import's transaction, once: True if this call ended it."""
        with let_go:
            return other.in_transaction and other.execute("COMMIT") is not None

    def hold(*_):
        if window.session.streaming is not None and window.session.streaming.content and not started:
            started.append(other.execute("BEGIN IMMEDIATE"))  # the import's transaction, from the first text on
            stall_probe.start()

    guard = threading.Timer(60, free)  # a window that waited on the file: the test fails, not hangs
    guard.start()
    window.session.model.dataChanged.connect(hold)
    window.input.setPlainText(PASSAGE)
    window.send_message()
    qtbot.waitUntil(lambda: not window.session.busy, timeout=60_000)
    still_held = other.in_transaction
    answer, cid = window.session.model.items[-1], window.session.conversation_id
    assert started and answer.status == "done" and still_held  # it ended while the file was held
    worst = stall_probe.stop()
    assert worst < stall_probe.LIMIT_S, f"the GUI thread worked {worst * 1000:.0f} ms in one go"
    busy = unsaved_notices(window)
    assert len(busy) == 1 and "the conversation file is busy" in busy[0].text, window.notices.texts()
    assert saved_rows(cid)[-1][3] == "streaming"  # the file has what it took before it was held

    assert free()  # the import is stored: the file is free (the test let go, not the guard)
    guard.cancel()
    qtbot.waitUntil(lambda: not unsaved_notices(window), timeout=60_000)
    assert saved_rows(cid)[-1] == (answer.id, "assistant", answer.content, "done")
    other.close()


@pytest.mark.slow
def test_renaming_or_deleting_while_the_file_is_held_says_so_and_changes_nothing(
    make_window, quick_settings, qtbot, monkeypatch, wait_response
):
    import app.conversations.sidebar as sidebar_module

    said = []
    monkeypatch.setattr(sidebar_module, "message", lambda parent, icon, title, text: said.append(text))
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.StandardButton.Yes))
    unhandled = count_unhandled()
    window = make_window(quick_settings)
    window.input.setPlainText("Name three colours.")
    window.send_message()
    wait_response(window, timeout=60_000)
    panel, cid = window.panel, window.session.conversation_id
    other = sqlite3.connect(default_path(), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # an import being stored
    index = panel.model.index(0)
    assert not panel.model.setData(index, "Colours")
    panel.delete(cid)
    assert len(said) == 2 and all("try again in a moment" in t for t in said) and unhandled == []
    other.execute("COMMIT")
    other.close()
    assert window.store.conversation(cid).title == "Name three colours."
    assert panel.model.setData(index, "Colours") and window.store.conversation(cid).title == "Colours"
