"""Model → Server…: the window serves its loaded model (the real embedded SmolLM2) through the OpenAI API,
its chat joins the same batch while a client streams, the log lists requests, and stopping gives the chat
its engine back."""

import socket
import threading
import time
from dataclasses import replace

import httpx
import pytest
from PySide6.QtCore import Qt

from support.window import PASSAGE, handled_on_gui, start

pytestmark = pytest.mark.slow  # long flows: the window serving its model to clients


def test_the_window_serves_its_model_and_its_chat_shares_the_batch(make_window, qtbot, wait_response, quick_settings):
    window = make_window(replace(quick_settings, max_tokens=30))
    panel = start(window, qtbot)
    url = panel.running["url"]
    assert window.server_label.isVisible() and url in window.server_label.text()
    assert url in panel.status.text() and not panel.port.isEnabled()

    reply = httpx.post(
        url + "/v1/completions", json={"prompt": "One, two, three,", "max_tokens": 8, "temperature": 0}, timeout=60
    ).json()
    assert reply["usage"]["completion_tokens"] == 8 and reply["timings"]["method"] == "lookup"
    qtbot.waitUntil(lambda: panel.log.rowCount() == 1, timeout=5000)
    row = [panel.log.data(panel.log.index(0, c)) for c in range(panel.log.columnCount())]
    assert row[2] == "/v1/completions" and row[4] == "8" and row[5] != "n/a" and row[9] == "length"

    # A client streams a long answer; the chat answers meanwhile, in the same batch.
    streamed, done = [], threading.Event()

    def client():
        body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 400, "stream": True, "ignore_eos": True, "temperature": 0}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    streamed.append(time.monotonic())
        done.set()

    thread = threading.Thread(target=client)
    thread.start()
    qtbot.waitUntil(lambda: len(streamed) > 3, timeout=30_000)
    window.input.setPlainText(PASSAGE)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    answer = wait_response(window)
    assert answer.status == "done" and "lighthouse" in answer.content
    assert answer.stats["generated"] >= 2 and answer.stats["tokens_per_s"] > 0
    assert not done.is_set(), "the client's stream should still be running when the chat's answer is done"
    thread.join(120)
    assert done.is_set()

    with handled_on_gui(qtbot, window.engine.worker.serverStopped, 30_000):
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    # The signal comes from the worker's thread: waitSignal can return before the window's own (queued) slots
    # have run, so wait for them rather than read the widgets at once (CI failed on that once).
    qtbot.waitUntil(lambda: not window.server_label.isVisible() and panel.port.isEnabled(), timeout=5000)
    try:
        httpx.get(url + "/health", timeout=2)
        raise AssertionError("the server still answers after Stop")
    except httpx.TransportError:
        pass
    window.input.setPlainText("The capital of France is")  # the chat has its engine back
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    assert wait_response(window).status == "done"
    assert window.settings.server_port == panel.port.value()  # the options were saved


def test_the_network_needs_a_key_and_a_key_is_enforced(make_window, qtbot, quick_settings):
    window = make_window(quick_settings)
    window.tools.open_server()
    panel = window.tools.server
    panel.lan.setChecked(True)
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert "API key" in panel.status.text() and panel.running is None
    panel.lan.setChecked(False)
    panel = start(window, qtbot, api_key="sesame")
    url = panel.running["url"]
    assert httpx.get(url + "/v1/models").status_code == 401
    models = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sesame"}).json()
    assert models["data"][0]["meta"]["parallel"] == panel.parallel.value()


def test_cors_for_every_page_without_a_key_is_warned_of_and_a_pages_plain_post_is_refused(
    make_window, qtbot, quick_settings
):
    window = make_window(quick_settings)
    panel = start(window, qtbot, cors="*")
    assert "Serving" in panel.status.text() and "every web page you visit" in panel.status.text()
    # A browser's simple cross-site POST (text/plain, no preflight): refused before the model, and listed.
    reply = httpx.post(
        panel.running["url"] + "/v1/completions",
        content='{"prompt": "Hi", "max_tokens": 2}',
        headers={"Content-Type": "text/plain", "Origin": "http://any.example"},
        timeout=30,
    )
    assert reply.status_code == 415 and reply.json()["error"]["code"] == "unsupported_media_type"
    qtbot.waitUntil(lambda: panel.log.rowCount() == 1, timeout=5000)
    row = [panel.log.data(panel.log.index(0, c)) for c in range(panel.log.columnCount())]
    assert row[2] == "/v1/completions" and row[8] == "-" and row[9] == "415"


def test_a_rebound_host_name_is_refused_unless_listed_in_the_panel(make_window, qtbot, quick_settings):
    """A page on a name its owner points at 127.0.0.1 (DNS rebinding) sends that name as Host: refused, unless the
    person lists it under Host names; this machine's own names always work."""
    window = make_window(quick_settings)
    panel = start(window, qtbot, hosts="mybox.local")
    url = panel.running["url"]
    port = url.rsplit(":", 1)[1].split("/")[0]
    assert httpx.get(url + "/v1/models", headers={"Host": f"evil.example:{port}"}).status_code == 403
    assert httpx.get(url + "/v1/models", headers={"Host": f"mybox.local:{port}"}).status_code == 200
    assert httpx.get(url + "/v1/models", headers={"Host": f"localhost:{port}"}).status_code == 200
    assert window.settings.server_hosts == "mybox.local"  # kept for the next start


def test_a_port_in_use_is_reported_and_the_chat_keeps_working(make_window, qtbot, wait_response, quick_settings):
    window = make_window(quick_settings)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        window.tools.open_server()
        panel = window.tools.server
        panel.port.setValue(taken.getsockname()[1])
        with handled_on_gui(qtbot, window.engine.worker.serverFailed, 60_000):
            qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    # serverFailed comes from the worker's thread: the panel's own (queued) slot may not have run yet.
    qtbot.waitUntil(lambda: "Could not listen" in panel.status.text(), timeout=5000)
    assert panel.start_button.text() == "Start server"
    window.input.setPlainText(PASSAGE)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    assert wait_response(window).status == "done"


def test_start_first_answer_and_stop_wait_on_nothing(make_window, qtbot, quick_settings, monkeypatch):
    """Start → first answer → Stop through the panel wait on no step timing: the first answer after Start is served
    on the chat's measured costs (no step is timed for it), and Start and Stop time nothing again. Counted, not
    clocked: every decode the calibration times is seen (a calibration here, what the first answer once waited
    on, took 14 s on its own). The times are printed for the reader, not compared."""
    import engine.decoding.calibration as calibration

    window = make_window(quick_settings)
    qtbot.waitUntil(lambda: window.engine.worker.decoder.loop.planner.steps.calibrated, timeout=120_000)
    timed, real = [], calibration.time_decode
    monkeypatch.setattr(calibration, "time_decode", lambda *a: timed.append(a[4]) or real(*a))
    clock = time.perf_counter
    began = clock()
    panel = start(window, qtbot)
    started = clock() - began
    url = panel.running["url"]
    answers = []
    # Prompts that share nothing, so no answer can copy an earlier one (lookup remembers answers).
    for prompt in ("The weather in Oslo today is", "My grandmother's soup recipe needs", "Trains to Lyon leave from"):
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        began = clock()
        reply = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        answers.append(clock() - began)
        assert reply["usage"]["completion_tokens"] == 24
        assert timed == [], f"a step was timed before answer {len(answers)}"
    began = clock()
    with handled_on_gui(qtbot, window.engine.worker.serverStopped, 30_000):
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.start_button.text() == "Start server", timeout=60_000)
    stopped = clock() - began
    print(
        f"\nserver panel: start {started:.2f} s, first answer {answers[0]:.2f} s, later answers "
        f"{answers[1]:.2f} and {answers[2]:.2f} s, stop {stopped:.2f} s"
    )
    assert timed == []  # Start, the answers and Stop timed no step
    assert window.engine.worker.decoder.loop.planner.steps.calibrated


COUNT = "Write the numbers from 1 to 300, separated by commas."


def stop_mid_answer(window, qtbot, wait_response, panel):
    """Send COUNT, stop the server through the panel once some of the answer is on screen; the answer, and the
    text that was on screen then."""
    window.input.setPlainText(COUNT)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(window.session.model.items[-1].content) > 10, timeout=60_000)
    seen = window.session.model.items[-1].content
    with handled_on_gui(qtbot, window.engine.worker.serverStopped, 30_000):
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    return wait_response(window, timeout=30_000), seen


def test_stopping_the_server_under_a_chat_keeps_the_answer_says_why_and_logs_no_failure(
    make_window, qtbot, wait_response, quick_settings, caplog, capfd
):
    import logging

    from app.chat.engine_picker import REMOTE

    caplog.set_level(logging.INFO)
    window = make_window(replace(quick_settings, max_tokens=400))
    panel = start(window, qtbot)
    uvicorn = logging.getLogger("uvicorn")  # its loggers stop at "uvicorn", short of caplog's root handler
    uvicorn.addHandler(caplog.handler)
    try:
        # The window's own chat, answered in the server's batch.
        answer, seen = stop_mid_answer(window, qtbot, wait_response, panel)
        assert answer.status == "error" and answer.content.startswith(seen)
        assert "stopped mid-answer" in answer.notice and "kept" in answer.notice, answer.notice

        # The chat on a remote engine that is this window's server.
        panel = start(window, qtbot)
        dialog = window.chat_settings_button.open_dialog()
        dialog.engine.setCurrentIndex(dialog.engine.findData(REMOTE))
        dialog.engine_url.setText(panel.running["url"])
        dialog.accept()
        answer, seen = stop_mid_answer(window, qtbot, wait_response, panel)
        assert answer.status == "error" and answer.content.startswith(seen) and len(answer.content) > 10
        assert "stopped mid-answer" in answer.notice and "kept" in answer.notice, answer.notice
        assert "RemoteProtocolError" not in answer.notice and "chunked" not in answer.notice
        qtbot.wait(300)  # anything the server's threads would still log on their way out
    finally:
        uvicorn.removeHandler(caplog.handler)
    said = "\n".join(r.getMessage() for r in caplog.records) + capfd.readouterr().err
    assert "Event loop is closed" not in said and "Traceback" not in said, said[-3000:]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], said[-3000:]


def test_the_panels_tok_s_is_the_apis_own_figure_and_says_what_it_counts(make_window, qtbot, quick_settings):
    from app.server.panel import RATE_MEANING, RequestLogModel
    from engine.figures import FIGURE

    window = make_window(quick_settings)
    panel = start(window, qtbot)
    reply = httpx.post(
        panel.running["url"] + "/v1/completions",
        json={"prompt": "The weather in Oslo today is", "max_tokens": 8, "temperature": 0, "ignore_eos": True},
        timeout=60,
    ).json()
    qtbot.waitUntil(lambda: panel.log.rowCount() == 1, timeout=5000)
    api = reply["timings"]["predicted_per_second"]
    column = RequestLogModel.RATE_COLUMN
    assert panel.log.records[0].tokens_per_s == api  # the very figure of the response, not another count
    assert panel.log.data(panel.log.index(0, column)) == FIGURE["tokens_per_s"].value_text(api)
    # The response's own count (llama.cpp's): every token over the time from the first to the last.
    timings = reply["timings"]
    assert api == pytest.approx(1000 * timings["predicted_n"] / timings["predicted_ms"])
    header = panel.log.headerData(column, Qt.Orientation.Horizontal)
    assert "API" in header and panel.log.headerData(column, Qt.Orientation.Horizontal, Qt.ToolTipRole) == RATE_MEANING
    assert "first included" in RATE_MEANING and "leaves the first token out" in RATE_MEANING


def test_the_api_key_is_masked_until_shown(make_window, qtbot, quick_settings):
    from PySide6.QtWidgets import QLineEdit

    window = make_window(replace(quick_settings, server_api_key="sesame-secret-key"), wait_loaded=False)
    window.tools.open_server()
    panel = window.tools.server
    assert panel.api_key.echoMode() == QLineEdit.EchoMode.Password
    assert "sesame" not in panel.api_key.displayText()  # what the screen shows
    qtbot.mouseClick(panel.show_key, Qt.MouseButton.LeftButton)
    assert panel.api_key.displayText() == "sesame-secret-key" and panel.show_key.text() == "Hide"
    qtbot.mouseClick(panel.show_key, Qt.MouseButton.LeftButton)
    assert "sesame" not in panel.api_key.displayText()
    assert panel.values()["server_api_key"] == "sesame-secret-key"  # masked, not changed
