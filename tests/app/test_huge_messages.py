"""No message of any size holds the GUI thread more than STALL_LIMIT_S at a time: one 2 MB line, a 5,000-row table
and 2 MB of words, streamed into the window or opened from a saved chat, folded with "Show all" (render.fold_point),
whose viewer takes the whole text a slice at a time. (A 50 MB answer from a remote server: test_remote_engine_window.)
On the code before the fold, a 256K-character line alone held the window 11 s."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from support.window import STALL_LIMIT_S, streams

pytestmark = pytest.mark.slow  # megabyte answers streamed and opened

LINE = "x" * 2_000_000
TABLE = "| n | square | name |\n|---|---|---|\n" + "".join(f"| {i} | {i * i} | row {i} |\n" for i in range(5000))
WORDS = " ".join(f"word{i % 977}" for i in range(250_000))[:2_000_000]


@pytest.mark.parametrize("text", [LINE, TABLE, WORDS], ids=["2MB-line", "5000-row-table", "2MB-words"])
def test_a_huge_answer_streams_and_opens_whole_without_stalling(
    make_window, qtbot, wait_response, quick_settings, stall_probe, text
):
    window = make_window(quick_settings)
    window.engine.worker.decoder.generate = streams(text, piece=64_000)
    stall_probe.start()
    window.session.send("Write a lot.")
    reply = wait_response(window)
    qtbot.wait(200)
    worst = stall_probe.stop()
    assert worst < STALL_LIMIT_S, f"the GUI thread worked {worst * 1000:.0f} ms in one go while the answer streamed"
    body = window.view.widget_for(1).text.answer
    assert reply.content == text
    assert body.show_all.isVisible() and f"{len(text):,} characters" in body.show_all.text()
    assert len(body.toPlainText()) < 20_000  # the rest is in the viewer

    stall_probe.start()
    body.show_all.click()
    viewer = body.viewer
    qtbot.waitUntil(lambda: viewer.done, timeout=120_000)
    qtbot.wait(100)
    worst = stall_probe.stop()
    assert viewer.view.document().toPlainText().replace("\n", "") == text.replace("\n", "")
    assert worst < STALL_LIMIT_S, f"the GUI thread worked {worst * 1000:.0f} ms in one go in the viewer"
    viewer.close()


def test_a_saved_chat_with_huge_messages_opens_without_stalling(make_window, qtbot, quick_settings, stall_probe):
    from app.conversations.store import ConversationStore, Message, default_path

    store = ConversationStore(default_path())
    cid = store.create_conversation("Huge")
    store.add_message(cid, Message(None, "user", LINE[:300_000]))
    store.add_message(cid, Message(None, "assistant", TABLE, stats={}))
    small = store.create_conversation("Small")  # the newest: the one the window opens at launch
    store.add_message(small, Message(None, "user", "Hello"))
    store.close()
    window = make_window(quick_settings, wait_loaded=False)
    qtbot.waitUntil(lambda: window.session.conversation_id == small, timeout=60_000)
    stall_probe.start()
    sidebar = window.panel.list
    qtbot.mouseClick(
        sidebar.viewport(),
        Qt.MouseButton.LeftButton,
        pos=sidebar.visualRect(window.panel.model.index(window.panel.model.row_of(cid))).center(),
    )
    qtbot.waitUntil(
        lambda: window.session.conversation_id == cid and window.view.widget_for(1) is not None, timeout=60_000
    )
    qtbot.wait(300)
    stall_probe._timer.stop()
    worst = max(stall_probe.gaps, default=float("inf"))  # the first gap too: the click's own rendering
    user, answer = window.view.widget_for(0).text.body, window.view.widget_for(1).text.answer
    assert user.show_all.isVisible() and answer.show_all.isVisible()
    assert worst < STALL_LIMIT_S, f"the GUI thread worked {worst * 1000:.0f} ms in one go"


def test_fold_point_weighs_long_lines_tables_and_code():
    from app.chat.render import DISPLAY_BUDGET, LONG_LINE, fold_point

    assert fold_point("short answer") is None and fold_point(("word " * 100 + "\n\n") * 25) is None  # 12,550: fits
    assert fold_point("x" * (LONG_LINE + 1)) == LONG_LINE  # one long line: cut in it
    assert fold_point("intro\n" + "y" * 10 * LONG_LINE) == 6 + LONG_LINE
    rows = "".join(f"| {i} | {i} |\n" for i in range(200))
    assert rows.index("\n| 60 |") < fold_point(rows) < rows.index("\n| 70 |")  # ~57 rows: a table row is dear
    code = "```\n" + "print(1)  # a line of code\n" * 2000 + "```\n"
    assert fold_point(code) > DISPLAY_BUDGET  # code is plain text: cheaper than markdown
    answer = ("text " * 50 + "\n") * 200
    fold = fold_point(answer)
    assert all(fold_point(answer[:n]) in (None, fold) for n in range(fold - 10, len(answer), 997))  # stays put
