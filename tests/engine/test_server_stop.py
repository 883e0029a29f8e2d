"""Stopping a server mid-answer: its clients are told, in words, that the server stopped and that the text so far
stands, and nothing in the server fails on the way out (no "Event loop is closed", no traceback). A client of a
server that only cuts the connection says the same in words, not httpx's "incomplete chunked read"."""

import logging
import threading
import time

import httpx
import pytest

from engine.decoding.sampling import SamplingParams
from engine.errors import EngineError
from engine.remote.client import RemoteEngine
from engine.remote.endpoint import Endpoint

from support.remote_server import HostileServer, event, specchat_server

LONG = [{"role": "user", "content": "Write the numbers from 1 to 300, separated by commas."}]


@pytest.fixture
def server_logs(caplog):
    """Every record, uvicorn's too (its loggers do not propagate to the root, where caplog listens)."""
    caplog.set_level(logging.INFO)
    uvicorn = logging.getLogger("uvicorn")
    uvicorn.addHandler(caplog.handler)
    yield caplog
    uvicorn.removeHandler(caplog.handler)


def no_failure_logged(caplog, capfd) -> None:
    said = "\n".join(r.getMessage() + (str(r.exc_info) if r.exc_info else "") for r in caplog.records)
    err = capfd.readouterr().err  # a thread's uncaught exception is printed here
    for text in (said, err):
        assert "Event loop is closed" not in text and "Traceback" not in text, text[-3000:]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], said[-3000:]


@pytest.mark.slow
def test_stopping_the_server_mid_answer_tells_the_client_and_logs_no_failure(server_logs, capfd):
    service, model = specchat_server()
    try:
        engine = RemoteEngine(Endpoint(service.url))
        answer = engine.answer(LONG, SamplingParams(temperature=0.0), 400, engine.model(), threading.Event())
        got, error, stopped = [], None, False
        try:
            for text in answer:
                got.append(text)
                if len("".join(got)) > 12 and not stopped:
                    stopped = True
                    service.stop()  # from the client's own thread: the stream is mid-answer
        except EngineError as exc:
            error = str(exc)
        whole = "".join(got)
        assert error is not None and "stopped mid-answer" in error and "kept" in error, error
        assert "RemoteProtocolError" not in error and "incomplete chunked read" not in error
        assert whole.startswith("1") and len(whole) > 12  # the text that came is the client's
        with pytest.raises(httpx.TransportError):
            httpx.get(service.url + "/health", timeout=2)
        time.sleep(0.3)  # anything the server's threads would still log on their way out
    finally:
        service.stop()
        model.close()
    no_failure_logged(server_logs, capfd)


def test_a_request_waiting_in_line_when_the_server_stops_is_told_so(server_logs, capfd):
    """parallel=2: a third request waits; stopping ends it with the same words, as a 500 with a reason."""
    service, model = specchat_server()
    try:
        body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 300, "ignore_eos": True, "temperature": 0, "stream": True}
        ends, started = [], threading.Barrier(3)

        def client():
            with httpx.stream("POST", service.url + "/v1/completions", json=body, timeout=60) as response:
                lines = response.iter_lines()
                started.wait()
                ends.append([line for line in lines if line.startswith("data: ")][-1])

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        started.wait()  # both streams have begun
        third = []
        helper = threading.Thread(
            target=lambda: third.append(
                httpx.post(service.url + "/v1/completions", json={**body, "stream": False}, timeout=60)
            )
        )
        helper.start()
        deadline = time.monotonic() + 60
        while (load := service.scheduler.load()).running < 2 or load.waiting < 1:  # both slots busy, one in line
            assert time.monotonic() < deadline, load
            time.sleep(0.02)
        service.stop()
        for t in [*threads, helper]:
            t.join(30)
    finally:
        service.stop()
        model.close()
    assert len(ends) == 2 and all("stopped mid-answer" in end for end in ends), ends
    assert third and third[0].status_code == 500 and "stopped mid-answer" in third[0].json()["error"]["message"]
    no_failure_logged(server_logs, capfd)


def test_a_connection_cut_mid_answer_is_said_in_words_with_the_text_kept():
    def cut(conn):
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        data = event({"role": "assistant", "content": "Hello"}) + event({"content": " there"})
        conn.send(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        conn.send(b'400\r\ndata: {"choi')  # a chunk that never ends: the server went away

    with HostileServer({"POST /v1/chat/completions": cut}) as server:
        engine = RemoteEngine(Endpoint(server.url))
        answer = engine.answer(LONG, SamplingParams(temperature=0.0), 50, engine.model(), threading.Event())
        got = []
        with pytest.raises(EngineError) as error:
            for text in answer:
                got.append(text)
    assert "".join(got) == "Hello there"
    message = str(error.value)
    assert "closed the connection mid-answer" in message and "text so far is kept" in message
    assert "RemoteProtocolError" not in message and "chunked" not in message


def test_a_request_still_tokenizing_is_counted_so_stop_waits_for_it_before_the_model_closes(monkeypatch):
    """Tokenizing runs in the server's thread pool, off the engine loop: stop() waits until none runs (in_flight),
    so a caller that closes the model next never closes it under a tokenizer still reading it (a segfault)."""
    from engine.serving.openai_api import _Handlers

    from support.serving import COUNTING, GUARD_S, Hold, start

    hold = Hold(monkeypatch, _Handlers, "chat_tokens")
    service, model = start(parallel=1)
    replies: list[object] = []
    try:
        body = {"model": "smollm2", "messages": COUNTING, "max_tokens": 4}
        asking = threading.Thread(
            target=lambda: replies.append(httpx.post(service.url + "/v1/chat/completions", json=body, timeout=GUARD_S))
        )
        asking.start()
        assert hold.entered.wait(GUARD_S)
        assert not service.api.in_flight.wait_idle(0)  # counted while it reads the model
        hold.release()
        asking.join(GUARD_S)
        assert service.api.in_flight.wait_idle(GUARD_S) and hold.finished.is_set()
        assert replies and replies[0].status_code == 200
    finally:
        hold.release()
        service.stop()
        model.close()


def test_in_flight_counts_work_while_it_runs_and_says_when_none_does():
    from engine.serving.in_flight import InFlight

    in_flight, inside, leave = InFlight(), threading.Event(), threading.Event()
    worker = threading.Thread(target=in_flight.call, args=(lambda: (inside.set(), leave.wait(60)),))
    worker.start()
    assert inside.wait(60) and not in_flight.wait_idle(0)
    leave.set()
    assert in_flight.wait_idle(60)
    worker.join(60)
    assert in_flight.call(lambda a, b: a + b, 2, 3) == 5 and in_flight.wait_idle(0)
