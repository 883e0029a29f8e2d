"""A chat answered by a remote engine, as a person sets it up: the chat settings dialog (server URL, List models,
API key), then Send, Stop, Continue, Regenerate, the context meter and the figures under each answer; a server that is
not there; and `specchat --smoke-test --engine-url`. The server is a real SpecChat server the test starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtWidgets import QDialogButtonBox

from app.chat.engine_picker import REMOTE
from engine.remote.keys import saved_key

from support.remote_server import DONE, HostileServer, drafting_specchat_server, event, specchat_server

pytestmark = pytest.mark.slow  # real servers and the window, answer after answer

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-remote-test-key-1234"
PASSAGE = (
    "Passage: The lighthouse at Point Arden was built in 1871 from granite quarried on the island itself.\n\n"
    "Copy the passage above word for word."
)


@pytest.fixture(scope="module")
def server():
    with drafting_specchat_server(api_key=KEY) as service:
        yield service


def set_engine(qtbot, window, url: str, key: str = "", max_tokens: int | None = None):
    """Through the chat settings dialog: a server, its models listed, a key; OK."""
    dialog = window.chat_settings_button.open_dialog()
    dialog.engine.setCurrentIndex(dialog.engine.findData(REMOTE))
    dialog.engine_url.setText(url)
    dialog.api_key.setText(key)
    if max_tokens:
        dialog.max_tokens.setValue(max_tokens)
    return dialog


def stats_text(window, row: int = -1) -> str:
    rows = len(window.session.model.items)
    return window.view.widget_for(row % rows).stats.text()


def test_a_chat_on_a_remote_server_streams_stops_and_regenerates_with_the_servers_figures(
    make_window, qtbot, wait_response, server, dirs, quick_settings
):
    window = make_window(quick_settings)
    dialog = set_engine(qtbot, window, server.url.replace("http://", ""), KEY)  # typed without the scheme
    assert dialog.engine_note.text() == ""  # a server on this machine: nothing to warn about
    dialog.list_models.click()
    qtbot.waitUntil(lambda: dialog.engine_model.count() == 1, timeout=10_000)
    assert dialog.engine_model.currentText() == "smollm2" and "serves 1 model" in dialog.engine_note.text()
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    host = server.url.removeprefix("http://")
    assert window.chat_settings_button.text() == f"Preset: Default (changed) · {host}"
    assert window.engine_label.isVisible() and window.engine_label.text() == f"This chat: remote engine at {host}"
    assert not any("built-in demo model" in text for text in window.notices.shown_texts())  # not this chat's model
    qtbot.waitUntil(lambda: saved_key(server.url) == KEY, timeout=5_000)  # in the keyring (its file backend here)
    # ... and in no file of SpecChat's:
    assert not any(
        KEY in p.read_text(errors="replace") for p in dirs.rglob("*") if p.is_file() and p.name != "keyring.cfg"
    )
    assert window.presets.get("Default").engine_url == ""  # this chat's engine, not the preset's

    # The context meter counts with the server's tokenizer and context.
    window.input.setPlainText(PASSAGE)
    # (Waited for by what it says: the figure shown before the server answers may be this machine's count.)
    qtbot.waitUntil(lambda: "server's own tokenizer" in window.meter.count.toolTip(), timeout=10_000)
    assert window.meter.count.text().endswith("/ 1,024 tokens") and "≈" not in window.meter.count.text()

    window.send_message()
    answer = wait_response(window)
    assert answer.status == "done" and "Point Arden" in answer.content
    assert answer.model == f"smollm2 @ {host}"
    line = stats_text(window)
    for part in (
        "tok/s incl. network",
        "TTFT",
        "accepted",
        "remote engine: prompt lookup",
        "n/a (remote)",
        f"remote {host} · CPU",
    ):
        assert part in line, line
    assert answer.stats["drafted"] > 0 and answer.stats["generated"] > 10

    # Stop mid-answer: the text so far stays, marked stopped.
    dialog = window.chat_settings_button.open_dialog()
    dialog.max_tokens.setValue(400)
    dialog.accept()
    window.input.setPlainText("Write the numbers from 1 to 300, separated by commas.")
    window.send_message()
    qtbot.waitUntil(lambda: len(window.session.model.items[-1].content) > 10, timeout=60_000)
    window.send_button.click()  # Stop
    stopped = wait_response(window, timeout=10_000)
    assert stopped.status == "stopped" and stopped.stats["finish_reason"] == "cancelled"
    assert "stopped by you" in stats_text(window)

    # Continue: more of the stopped answer, written by the server into the same message.
    before = stopped.content
    assert window.session.continue_answer()
    continued = wait_response(window)
    assert continued.id == stopped.id and continued.status == "done"
    assert continued.content.startswith(before) and len(continued.content) > len(before) + 10

    # Regenerate: a second answer beside the first, from the server again.
    assert window.session.regenerate()
    again = wait_response(window)
    assert again.status == "done" and again.content and again.id != stopped.id
    assert len(window.session.store.tree(window.session.conversation_id).siblings(again)) == 2


def test_a_server_that_is_not_there_fails_the_answer_and_the_window_goes_on(
    make_window, qtbot, wait_response, quick_settings
):
    window = make_window(quick_settings)
    dialog = set_engine(qtbot, window, "http://127.0.0.1:9")
    dialog.accept()
    assert not any("built-in demo model" in text for text in window.notices.shown_texts())
    window.input.setPlainText("Hello?")
    qtbot.waitUntil(lambda: "n/a (remote)" in window.meter.count.text(), timeout=10_000)
    window.send_message()
    failed = wait_response(window)
    assert failed.status == "error" and "Could not reach http://127.0.0.1:9" in failed.notice

    # Compare runs on this machine's engine, and says so for a chat answered elsewhere.
    window.tools.open_compare()
    compare = window.tools.compare
    compare.max_tokens.setValue(4)
    with qtbot.waitSignal(compare.comparisonFinished, timeout=120_000):
        compare.start()
        assert "answered by http://127.0.0.1:9; Compare measures this machine's engine" in compare.status.text()
    assert compare.plain_pane.plain_text() and compare.spec_pane.plain_text()
    compare.close()

    # The same chat back on this machine answers as before.
    dialog = window.chat_settings_button.open_dialog()
    dialog.engine.setCurrentIndex(dialog.engine.findData(""))
    dialog.accept()
    assert not window.engine_label.isVisible()
    assert any("built-in demo model" in text for text in window.notices.shown_texts())  # this chat's model again
    window.input.setPlainText("Say hello.")
    window.send_message()
    assert wait_response(window).status == "done" and window.session.model.items[-1].content


def test_without_a_keyring_the_key_is_used_until_quit_and_the_window_says_so(
    make_window, qtbot, wait_response, server, quick_settings
):
    import keyring
    from keyring.backends.fail import Keyring as NoKeyring

    from app.remote_answer import use_key_for_this_run

    keyring.set_keyring(NoKeyring())  # a bare Linux without a secret service (the fixture puts its own back)
    use_key_for_this_run(server.url, "")  # nothing from an earlier test in this process
    window = make_window(quick_settings)
    set_engine(qtbot, window, server.url, KEY).accept()
    qtbot.waitUntil(
        lambda: any("could not be kept in this system's keyring" in t for t in window.notices.shown_texts()),
        timeout=5_000,
    )
    window.input.setPlainText("Say hello.")
    window.send_message()
    assert wait_response(window).status == "done"  # the key typed is used for this run


def test_the_dialog_warns_about_plain_http_beyond_this_machine_and_refuses_a_bad_url(
    make_window, qtbot, quick_settings
):
    window = make_window(quick_settings, wait_loaded=False)
    dialog = set_engine(qtbot, window, "http://gpu.example.org:8000")
    assert "unencrypted" in dialog.engine_note.text()
    dialog.engine_url.setText("ftp://gpu.example.org")
    assert "http:// or https://" in dialog.engine_note.text()
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert dialog.isVisible() and "http:// or https://" in dialog.error.text()  # nothing saved, the dialog stays
    assert window.session.remote_endpoint() is None
    dialog.reject()


def test_the_smoke_test_answers_through_a_remote_engine(server, dirs):
    from support.children import child_env

    env = dict(child_env(dirs), REMOTE_KEY=KEY)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "--smoke-test",
            "--engine-url",
            server.url,
            "--api-key-env",
            "REMOTE_KEY",
            "--prompt",
            PASSAGE,
            "--timeout",
            "120",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["backend"].startswith("remote 127.0.0.1:") and stats["model"].startswith("smollm2 @ 127.0.0.1:")
    assert "Point Arden" in stats["text"] and stats["tokens_per_s"] > 0 and stats["drafted"] > 0
    refused = subprocess.run(
        [sys.executable, "-m", "app", "--smoke-test", "--engine-url", server.url, "--timeout", "120"],
        cwd=ROOT,
        env=child_env(dirs),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 1 and "refused the API key" in refused.stderr


def test_the_lab_window_runs_the_experiment_against_servers(qtbot, server, tmp_path):
    """Model → Speculation lab… with Engine set to servers: a plain SpecChat server and the lookup one (its key the
    one saved for chats), the chart and table filled as cells finish, the crossover, and nothing to apply."""
    from app.lab.form import SERVERS
    from app.lab.window import CUSTOM, LabWindow
    from engine.remote.keys import save_key

    save_key(server.url, KEY)
    plain, plain_model = specchat_server(plain=True)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "copy", "prompt": PASSAGE}) + "\n")
    lab = LabWindow()
    qtbot.addWidget(lab)
    try:
        lab.form.engine.setCurrentIndex(lab.form.engine.findData(SERVERS))
        assert not lab.draft_edit.isVisible() or not lab.isVisible()
        lab.form.servers_edit.setText(f"none={plain.url}, lookup={server.url}")
        lab.form.clients_edit.setText("1,2")
        lab.prompt_combo.setCurrentIndex(lab.prompt_combo.findData(CUSTOM))
        lab.prompt_file.setText(str(prompts))
        lab.max_tokens.setValue(48)  # room for the copy to draft whatever curve the planner has
        lab.show()
        assert lab.form.servers_edit.isVisible() and not lab.draft_edit.isVisible()
        with qtbot.waitSignal(lab.runFinished, timeout=180_000) as done:
            lab.run_button.click()
        results = done.args[0]
    finally:
        lab.shutdown()
        plain.stop()
        plain_model.close()
    assert results["env"]["remote"] and lab.table.rowCount() == 4
    assert [x for x, _ in lab.rate_chart.points("lookup")] == [1, 2] and lab.rate_chart.points("none")
    cells = {(c["method"], c["concurrency"]): c for c in results["cells"]}
    assert cells[("lookup", 1)]["drafted"] > 0 and not cells[("lookup", 2)]["errors"]  # the saved key was sent
    assert "lookup" in results["crossover"] and "nothing here to apply" in lab.advice.text()
    assert not lab.apply_button.isEnabled()


def test_stop_while_the_server_is_silent_ends_the_answer_at_once_with_its_text_kept(
    make_window, qtbot, wait_response, quick_settings, monkeypatch
):
    """A server that sends a little and then nothing: Stop ends the answer (not the session's grace for an engine
    that does not stop), the text so far kept and marked stopped, while the server is still silent."""
    import app.chat.response as response_module

    # The grace outlasts the test's own waits: only the engine can end the answer, however loaded the machine
    # (with the 3 s grace, a client slow to see Stop on a busy CI machine read as a stuck engine).
    monkeypatch.setattr(response_module, "STOP_GRACE_S", 600.0)
    silent = []  # how each silence ended: False when the client went

    def hello_then_silence(conn):
        conn.head()
        conn.send(
            event({"role": "assistant", "content": ""}) + event({"content": "Hello"}) + event({"content": " there"})
        )
        silent.append(conn.wait(300))  # ends early only once the client goes

    with HostileServer({"POST /v1/chat/completions": hello_then_silence}) as server:
        window = make_window(quick_settings)
        set_engine(qtbot, window, server.url).accept()
        window.input.setPlainText("Hello?")
        window.send_message()
        # shown while the server is silent, not held back for a next piece that never comes
        qtbot.waitUntil(lambda: window.session.model.items[-1].content == "Hello there", timeout=60_000)
        window.send_button.click()  # Stop
        stopped = wait_response(window, timeout=60_000)
        assert server.last("POST /v1/chat/completions").gone.wait(60)  # the request ended on the server too ...
        qtbot.waitUntil(lambda: bool(silent), timeout=60_000)
    assert silent == [False]  # ... because the client went, not because the server spoke or gave up
    assert stopped.status == "stopped" and stopped.content == "Hello there"
    assert not stopped.notice and stopped.stats["finish_reason"] == "cancelled"  # the engine stopped, not the grace
    assert "stopped by you" in stats_text(window)


def test_stop_while_the_server_is_silent_on_its_model_list_ends_the_answer_at_once(monkeypatch):
    """Before the answer is asked for, its model is (the server's list): Stop does not wait on that either. The
    server says nothing until the test lets it go, and the client would wait as long: Stop is pressed once the
    server has the request, and the answer must end while the server is still silent."""
    import threading
    from types import SimpleNamespace

    import engine.remote.client as client_module
    from app.answers import GenerationRequest, run_answer
    from app.remote_answer import RemoteAnswers
    from engine.remote.endpoint import Endpoint

    monkeypatch.setattr(client_module, "QUICK_TIMEOUT_S", 600.0)  # a client that waited would wait the server out
    signals = []
    worker = SimpleNamespace(
        **{
            name: SimpleNamespace(emit=lambda *args, name=name: signals.append((name, *args)))
            for name in ("started", "progress", "finished", "failed")
        }
    )
    asked, let_go = threading.Event(), threading.Event()

    def silent(conn):
        asked.set()
        while not let_go.is_set() and conn.wait(0.05):
            pass

    with HostileServer({"GET /v1/models": silent}) as server:
        request = GenerationRequest([{"role": "user", "content": "Hello?"}], remote=Endpoint(server.url))
        answering = threading.Thread(target=run_answer, args=(RemoteAnswers(), request, worker), daemon=True)
        answering.start()
        assert asked.wait(60)
        request.cancel.set()  # Stop, while the server is silent on its list
        answering.join(60)
        ended = not answering.is_alive()  # and the server has said nothing yet
        let_go.set()
    assert ended and [s[0] for s in signals] == ["started", "finished"]
    assert signals[-1][2]["finish_reason"] == "cancelled"


def test_a_model_id_that_is_a_path_is_shown_by_its_file_name():
    from app.remote_answer import model_label

    assert model_label("/srv/models/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model_label("C:\\models\\qwen.gguf") == "qwen.gguf"
    assert model_label("Qwen/Qwen2.5-Coder-7B-Instruct") == "Qwen/Qwen2.5-Coder-7B-Instruct"  # a hub id stays


def test_a_50_mb_answer_from_a_server_never_stalls_the_window(
    make_window, qtbot, wait_response, quick_settings, stall_probe
):
    """A server that pours out 50 MB (60 KB a chunk): the client keeps what max_tokens allows, the window folds it
    (render.fold_point), and the GUI thread never waits more than the stall limit."""
    piece = "lorem ipsum " * 5_000  # 60 KB of text in one chunk

    def pours(conn):
        conn.head()
        for _ in range(50_000_000 // len(piece)):
            if not conn.send(event({"content": piece})):
                return

    with HostileServer({"POST /v1/chat/completions": pours}) as server:
        window = make_window(quick_settings)
        set_engine(qtbot, window, server.url, max_tokens=4096).accept()
        stall_probe.start()
        window.input.setPlainText("Say a lot.")
        window.send_message()
        reply = wait_response(window, timeout=60_000)
        qtbot.wait(200)
        worst = stall_probe.stop()
        assert server.last("POST /v1/chat/completions").sent < 20_000_000  # it stopped reading long before 50 MB
    assert reply.content.startswith("lorem ipsum") and len(reply.content) <= 64 * (4096 + 1024) + len(piece)
    assert window.view.widget_for(1).text.answer.show_all.isVisible()
    assert worst < stall_probe.LIMIT_S, f"the GUI thread worked {worst * 1000:.0f} ms in one go"


def test_a_servers_answer_and_error_naming_local_files_read_none_of_them(
    make_window, qtbot, wait_response, quick_settings, tmp_path
):
    """What a server sends is rendered like a local answer (app/safe_text.py): its images and its error text's
    HTML load nothing, whichever widget shows them (the message, its error line, a notice)."""
    from support.fifo_trap import FifoTrap

    with FifoTrap(tmp_path / "remote.fifo") as trap:
        hostile = f'![x]({trap.url}) <img src="{trap.url}">'

        def answers(conn):
            conn.head()
            conn.send(
                event({"role": "assistant", "content": ""})
                + event({"content": f"Look: {hostile} end."})
                + event({}, finish="stop")
                + DONE
            )

        def fails(conn):
            conn.json({"error": {"message": f"{hostile} the model is busy"}}, status=500)

        with HostileServer({"POST /v1/chat/completions": answers}) as server:
            window = make_window(quick_settings)
            set_engine(qtbot, window, server.url).accept()
            window.input.setPlainText("Hello?")
            window.send_message()
            assert wait_response(window).content.endswith("end.")
        with HostileServer({"POST /v1/chat/completions": fails}) as server:
            set_engine(qtbot, window, server.url).accept()
            window.input.setPlainText("Again?")
            window.send_message()
            failed = wait_response(window)
            qtbot.wait(300)
        assert failed.status == "error" and "the model is busy" in failed.notice
        assert trap.opened == 0
