"""Text a server sends that Python keeps but no encoder takes (a lone surrogate, valid JSON as "\\ud800"), and bidi
controls that make one name read as another (issue 63, items 1 and 6): the answer is shown, saved and reloaded
after a restart; the controls are shown by their code in the answer and gone from the model's name."""
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from remote_server import DONE, HostileServer  # noqa: E402  (tests/engine/remote_server.py)

from app.chat.engine_picker import REMOTE  # noqa: E402
from app.conversations.store import ConversationStore, default_path  # noqa: E402

RLO = "\u202e"
# As servers write JSON with ensure_ascii: the surrogate is an escape, valid JSON, and no UTF-8 encoder takes it.
CHUNKS = [r'{"model":"gnp\u202e.exe","choices":[{"index":0,"delta":{"role":"assistant","content":"half "}}]}',
          r'{"model":"gnp\u202e.exe","choices":[{"index":0,"delta":{"content":"\ud83d an emoji, '
          r'file \u202egnp.exe, then \ud83d\ude00"}}]}',
          r'{"model":"gnp\u202e.exe","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}']


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
        make_window, qtbot, wait_response, quick_settings):
    with HostileServer({"POST /v1/chat/completions": answers, "GET /v1/models": models}) as server:
        window = make_window(quick_settings)
        use_server(window, server.url)
        window.input.setPlainText("Hello?")
        window.send_message()
        reply = wait_response(window)
    assert reply.status == "done", reply.notice
    assert reply.content == f"half \ufffd an emoji, file {RLO}gnp.exe, then \U0001F600"
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
