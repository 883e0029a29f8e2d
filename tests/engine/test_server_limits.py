"""The server under hostile requests and hostile models: a chat template that spins or hogs memory, a 20 MB
body, a prompt far beyond the context, connections that say nothing. Each ends with a clear error, /health
answers while the hostile work is held in progress (no time is measured: the machine's load is unknown), and
memory stays bounded. (A tiny real GGUF: it loads and decodes in ms.)"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from engine.serving import openai_api
from engine.serving import service as service_module
from engine.serving.service import TimedH11Protocol
from engine.template_sandbox import TemplateSandbox

from support.hostile_templates import HOGS, hostile_gguf
from support.serving import GUARD_S, SPINS_ON_W9, Hold, healthy_while_held, serve

HELLO = [{"role": "user", "content": "w1 w2"}]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture()
def spinning(cache):
    service, model = serve(hostile_gguf(cache / "spins-on-w9.gguf", SPINS_ON_W9, complete=True))
    yield service
    service.stop()
    model.close()


def chat(url: str, messages, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 4, **extra}, timeout=60)


@pytest.mark.slow
def test_a_template_that_spins_is_a_clear_error_and_the_server_keeps_answering(spinning, monkeypatch):
    assert chat(spinning.url, HELLO).status_code == 200  # the template works on this conversation
    rendering = Hold(monkeypatch, TemplateSandbox, "render")  # /health answers while the spinning render waits
    reply, grew = healthy_while_held(
        spinning.url, lambda: chat(spinning.url, [{"role": "user", "content": "w9"}]), rendering
    )
    assert reply.status_code == 500, reply.text
    error = reply.json()["error"]
    assert error["code"] == "chat_template_refused" and error["type"] == "server_error"
    assert "spins-on-w9.gguf" in error["message"] and "took over 3 s" in error["message"]
    assert "/v1/completions" in error["message"]
    assert rendering.calls == 1 and grew < 1 << 30, (rendering.calls, grew)
    # Refused for good (no second 3 s wait): chat says so without rendering again; raw completions still work.
    renders = []
    real_render = TemplateSandbox.render
    monkeypatch.setattr(TemplateSandbox, "render", lambda *a, **k: renders.append(a) or real_render(*a, **k))
    assert chat(spinning.url, HELLO).json()["error"]["code"] == "chat_template_refused"
    assert renders == []
    done = httpx.post(spinning.url + "/v1/completions", json={"prompt": "w1 w2", "max_tokens": 3}, timeout=60)
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] >= 1
    meta = httpx.get(spinning.url + "/v1/models").json()["data"][0]["meta"]
    assert "took over 3 s" in meta["chat_template_error"]


def test_a_template_the_model_check_refused_is_said_at_once(cache, caplog, monkeypatch):
    service, model = serve(hostile_gguf(cache / "hogs.gguf", HOGS, complete=True))
    try:
        assert "hogs.gguf was refused" in caplog.text and "Chat requests will be refused" in caplog.text
        renders = []
        real_render = TemplateSandbox.render
        monkeypatch.setattr(TemplateSandbox, "render", lambda *a, **k: renders.append(a) or real_render(*a, **k))
        preparing = Hold(monkeypatch, openai_api._Handlers, "chat_tokens")  # the request's work off the event loop
        reply, grew = healthy_while_held(service.url, lambda: chat(service.url, HELLO), preparing)
        assert reply.status_code == 500 and "512 MB" in reply.json()["error"]["message"]
        assert renders == [] and grew < 1 << 30  # refused as the check said: not rendered again
    finally:
        service.stop()
        model.close()


def declared_then_silent(url: str, path: str, size: int) -> tuple[int, dict]:
    """A request that declares a body of `size` bytes and sends none of it: the status and JSON the server
    answers with. (Sent whole, a refused body races the server's close: a reset that overtook its reply lost the
    413 now and then, at random, client side.)"""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n".encode()
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_20_mb_body_is_refused_before_it_is_read(spinning, monkeypatch):
    reading = Hold(monkeypatch, openai_api._Handlers, "read_body")  # /health answers while this request is open
    (status, reply), _ = healthy_while_held(
        spinning.url, lambda: declared_then_silent(spinning.url, "/v1/chat/completions", 20 << 20), reading
    )
    assert status == 413 and reply["error"]["code"] == "request_too_large"
    assert "8,388,608" in reply["error"]["message"] and "20,971,520" in reply["error"]["message"]
    assert reading.calls == 1

    def chunks():  # no Content-Length: refused once the limit has come
        for _ in range(40):
            yield b"x" * (1 << 20)

    try:
        chunked = httpx.post(
            spinning.url + "/v1/completions", content=chunks(), timeout=60, headers={"Content-Type": "application/json"}
        )
        assert chunked.status_code == 413
    except httpx.TransportError:
        pass  # the server may close the connection while the client is still sending: it did not read it
    assert httpx.get(spinning.url + "/health").status_code == 200


def test_a_prompt_far_beyond_the_context_is_refused_from_its_size_without_tokenizing(spinning):
    target = spinning.scheduler.target
    tokenized: list[int] = []
    real = target.tokenize

    def watched(text, *args, **kwargs):
        tokenized.append(len(text))
        return real(text, *args, **kwargs)

    target.tokenize = watched
    try:
        giant = "w1 " * (2 << 20)  # 6 MB, under the body limit
        for reply in (
            chat(spinning.url, [{"role": "user", "content": giant}]),
            httpx.post(spinning.url + "/v1/completions", json={"prompt": giant}, timeout=60),
        ):
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert error["code"] == "context_length_exceeded" and "512-token context" in error["message"]
        assert max(tokenized, default=0) < 1 << 16, "the giant prompt was tokenized"
    finally:
        del target.tokenize


class _WatchedAsyncio:
    """openai_api's asyncio, with the timeouts it passes to wait_for noted."""

    def __init__(self, timeouts: list[float]):
        self.timeouts = timeouts

    def __getattr__(self, name: str):
        return getattr(asyncio, name)

    def wait_for(self, awaitable, timeout):
        self.timeouts.append(timeout)
        return asyncio.wait_for(awaitable, timeout)


@pytest.mark.slow
def test_connections_that_send_nothing_or_dribble_are_closed(spinning, monkeypatch):
    """The server's own timeouts (1 s here) close them, not the test: each client stays connected, silent or
    dribbling, until it sees the close (its wait is only a guard), and the server's timer set from that setting
    is what closed it. No time is measured."""
    monkeypatch.setattr(service_module, "REQUEST_HEAD_TIMEOUT_S", 1.0)
    monkeypatch.setattr(openai_api, "BODY_TIMEOUT_S", 1.0)
    head_delays, closed_by_timer, body_timeouts = {}, [], []
    real_arm, real_timed_out = TimedH11Protocol._arm_head_timer, TimedH11Protocol._head_timed_out

    def arm(protocol):  # the delay the head timer was set to lies between when-after and when-before
        before = protocol.loop.time()
        real_arm(protocol)
        after, when = protocol.loop.time(), protocol._head_timer.when()
        head_delays.setdefault(protocol.client, []).append((when - after, when - before))

    def timed_out(protocol):
        was_closing = protocol.transport.is_closing()
        real_timed_out(protocol)
        if not was_closing and protocol.transport.is_closing():
            closed_by_timer.append(protocol.client)

    monkeypatch.setattr(TimedH11Protocol, "_arm_head_timer", arm)
    monkeypatch.setattr(TimedH11Protocol, "_head_timed_out", timed_out)
    monkeypatch.setattr(openai_api, "asyncio", _WatchedAsyncio(body_timeouts))
    host, port = "127.0.0.1", spinning.port

    def closed_by_server(sock: socket.socket, dribble: bytes = b"") -> bytes:
        """What the server sent before it closed the connection, which the client keeps open until then."""
        sock.settimeout(0.2)
        got, guard = b"", time.monotonic() + GUARD_S
        while time.monotonic() < guard:
            if dribble:
                try:
                    sock.sendall(dribble)
                except OSError:  # reset or broken pipe: the server closed it
                    return got
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return got
            if not chunk:
                return got
            got += chunk
        raise AssertionError(f"still open after {GUARD_S:g} s; got {got[:200]!r}")

    def head_timer_closed(sock: socket.socket) -> bool:
        """This connection's head timer was set to REQUEST_HEAD_TIMEOUT_S, and it is what closed it."""
        me = sock.getsockname()
        (shortest, longest), *_ = head_delays[me]
        return shortest <= 1.0 + 1e-6 and longest >= 1.0 - 1e-6 and closed_by_timer.count(me) == 1

    with socket.create_connection((host, port)) as silent:
        assert closed_by_server(silent) == b""
        assert head_timer_closed(silent), (head_delays, closed_by_timer)
    with socket.create_connection((host, port)) as dribbling:
        dribbling.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed_by_server(dribbling, dribble=b"X")
        assert head_timer_closed(dribbling), (head_delays, closed_by_timer)
    with socket.create_connection((host, port)) as slow_body:
        slow_body.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"messages"'
        )
        answer = closed_by_server(slow_body)
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
        assert b"did not arrive within 1 s" in answer and body_timeouts == [1.0], body_timeouts
    assert httpx.get(spinning.url + "/health").status_code == 200
