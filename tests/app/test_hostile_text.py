"""Text a server sends that Python keeps but no encoder takes (a lone surrogate, valid JSON as "\\ud800"), and bidi
controls that make one name read as another (issue 63, items 1 and 6): the answer is shown, saved and reloaded
after a restart; the controls are shown by their code in the answer and gone from the model's name."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from app.chat.engine_picker import REMOTE
from app.conversations.files import conversation_data
from app.conversations.store import ConversationStore, default_path

from support.remote_server import DONE, HostileServer

ROOT = Path(__file__).resolve().parents[2]
RLO = "\u202e"
# As servers write JSON with ensure_ascii: the surrogate is an escape, valid JSON, and no UTF-8 encoder takes it.
CHUNKS = [
    r'{"model":"gnp\u202e.exe","choices":[{"index":0,"delta":{"role":"assistant","content":"half "}}]}',
    r'{"model":"gnp\u202e.exe","choices":[{"index":0,"delta":{"content":"\ud83d an emoji, '
    r'file \u202egnp.exe, then \ud83d\ude00"}}]}',
    r'{"model":"gnp\u202e.exe","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
]


def menu_action(window, text: str):
    """The menu bar's item that reads text, as a person finds it."""
    return next(
        action
        for top in window.menuBar().actions()
        for action in top.menu().actions()
        if action.text().replace("&", "") == text
    )


def use_server(window, url: str) -> None:
    """Through the chat settings dialog, as a person sets a remote engine: its URL; OK."""
    dialog = window.chat_settings_button.open_dialog()
    dialog.engine.setCurrentIndex(dialog.engine.findData(REMOTE))
    dialog.engine_url.setText(url)
    dialog.accept()


def models(conn):
    conn.json({"object": "list", "data": [{"id": "gnp\u202e.exe", "object": "model"}]})


def answers(conn):
    conn.head()
    conn.send(b"".join(b"data: " + chunk.encode() + b"\n\n" for chunk in CHUNKS) + DONE)


def test_a_lone_surrogate_and_bidi_controls_from_a_server_are_saved_reloaded_and_shown_plainly(
    make_window, qtbot, wait_response, quick_settings
):
    with HostileServer({"POST /v1/chat/completions": answers, "GET /v1/models": models}) as server:
        window = make_window(quick_settings)
        use_server(window, server.url)
        window.input.setPlainText("Hello?")
        window.send_message()
        reply = wait_response(window)
    assert reply.status == "done", reply.notice
    assert reply.content == f"half \ufffd an emoji, file {RLO}gnp.exe, then \U0001f600"
    shown = window.view.widget_for(1).text.answer.toPlainText()
    assert "⟨U+202E⟩gnp.exe" in shown and RLO not in shown
    assert RLO not in reply.model and "gnp.exe" in reply.model
    conversation = window.session.conversation_id
    window.close()

    # After a restart: the answer as it was shown, done, not an empty "interrupted" row.
    store = ConversationStore(default_path())
    try:
        saved = store.messages(conversation)[-1]
        assert (saved.content, saved.status) == (reply.content, "done")
    finally:
        store.close()
    assert sqlite3.connect(default_path()).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_an_import_holding_a_lone_surrogate_and_a_bidi_title_is_imported_with_both_made_safe(
    make_window, qtbot, quick_settings, monkeypatch, tmp_path
):
    """A chat exported elsewhere with "\\ud800" escapes (valid JSON) in its title and text: imported through
    File → Import, not refused with "Something went wrong: UnicodeEncodeError"; its title reads as it is."""
    window = make_window(quick_settings)
    window.input.setPlainText("Hello")
    window.send_message()
    qtbot.waitUntil(lambda: not window.session.busy, timeout=60_000)
    exported = tmp_path / "chat.json"
    data = conversation_data(window.store, window.session.conversation_id)  # what Export writes
    data["title"] = f"Invoice {RLO}fdp.exe"
    data["messages"][0]["content"] = "half \ud83d an emoji"
    exported.write_text(json.dumps(data))  # ensure_ascii: the surrogate as its escape, as JSON allows
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(exported), "")))
    menu_action(window, "Import conversation…").trigger()  # returns once the import is done (off the GUI thread)
    titles = [c.title for c in window.store.conversations()]
    assert "Invoice fdp.exe (imported)" in titles, (titles, window.notices.texts())
    imported = next(c for c in window.store.conversations() if c.title == "Invoice fdp.exe (imported)")
    assert window.store.messages(imported.id)[0].content == "half \ufffd an emoji"
    assert not any("went wrong" in t for t in window.notices.texts())


def test_a_files_and_a_models_name_lose_their_bidi_controls_where_they_are_shown(
    make_window, qtbot, quick_settings, tmp_path
):
    from app.models.model_names import model_label

    evil = tmp_path / f"notes{RLO}txt.exe.md"
    evil.write_text("# notes\n")
    window = make_window(quick_settings)
    window.tray.add_files([str(evil)])
    qtbot.waitUntil(lambda: bool(window.tray.attachments), timeout=30_000)
    chip = window.tray.chips[0]
    assert chip.view_button.text().startswith("notestxt.exe.md") and RLO not in chip.view_button.toolTip()
    assert window.tray.attachments[0].name == evil.name  # the file itself is named as it is, for the model
    assert RLO not in model_label(str(tmp_path / f"model{RLO}fgg.Q4_K_M.gguf"))


def test_the_smoke_test_saves_and_prints_an_answer_holding_a_lone_surrogate(dirs):
    """`specchat --smoke-test --engine-url` on that server: it exited 1 with the save's UnicodeEncodeError."""
    env = {
        **os.environ,
        "SPECCHAT_CONFIG_DIR": str(dirs / "config"),
        "SPECCHAT_DATA_DIR": str(dirs / "data"),
        "QT_QPA_PLATFORM": "offscreen",
    }
    with HostileServer({"POST /v1/chat/completions": answers, "GET /v1/models": models}) as server:
        result = subprocess.run(
            [sys.executable, "-m", "app", "--smoke-test", "--engine-url", server.url, "--timeout", "120"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["text"] == f"half \ufffd an emoji, file {RLO}gnp.exe, then \U0001f600"
    assert stats["model"].startswith("gnp.exe @ ")
