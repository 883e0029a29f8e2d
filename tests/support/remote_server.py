"""Servers on 127.0.0.1 for the remote-engine tests: a real SpecChat server (the embedded SmolLM2, prompt lookup),
and a hostile one that sends what a test says (lines without end, huge bodies, silence, a byte now and then)."""

import json
import select
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from engine.decoding.proposers.base import NoProposer
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.speculation_config import SpeculationConfig
from engine.modelfiles.embedded import embedded_model_path
from engine.serving.service import ServeOptions, Service

from .step_costs import ONE_ROW_S, pin_step_costs


def specchat_server(api_key: str | None = None, n_ctx: int = 1024, plain: bool = False) -> tuple[Service, Model]:
    """(the running service, its model): stop the one, then close the other. plain: no speculation."""
    model = Model(embedded_model_path(), LoadSettings(n_ctx=n_ctx, threads=2, n_seq_max=2))
    service = Service(
        model,
        NoProposer() if plain else LookupProposer(),
        SpeculationConfig(max_draft=8),
        ServeOptions(port=0, parallel=2, api_key=api_key),
        model_id="smollm2",
    ).start()
    return service, model


@contextmanager
def drafting_specchat_server(api_key: str | None = None) -> Iterator[Service]:
    """specchat_server whose planner sees step costs where a verified row costs a tenth of a step (a GPU's figure),
    so its lookup drafts on a copy whatever this machine's live timings say: for tests of the figures drafts give
    (on a 2-core CPU with a fresh cache the planner may bet on nothing, and the figures have no drafts to show)."""
    with pytest.MonkeyPatch.context() as patch:
        pin_step_costs(patch, one_row_s=ONE_ROW_S, extra_row_s=ONE_ROW_S / 10)
        service, model = specchat_server(api_key=api_key)
        try:
            yield service
        finally:
            service.stop()
            model.close()


# --- a server that misbehaves ---------------------------------------------------------------------------------
MIB = 1 << 20


def event(delta: dict | None = None, finish: str | None = None, end: bytes = b"\n\n", **extra) -> bytes:
    """One chat.completion.chunk as a server-sent event, its text as UTF-8 (not \\u escapes, as servers write it)."""
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "hostile",
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + end


DONE = b"data: [DONE]\n\n"


class Conn:
    """One request's connection, as a route writes its answer: send() says False once the client has gone."""

    def __init__(self, sock: socket.socket, body: bytes):
        self.sock, self.body = sock, body
        self.sent = 0  # bytes the client took (its kernel's buffers included)
        self.gone = threading.Event()  # the client closed or shut its end

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
        except OSError:
            self.gone.set()
            return False
        self.sent += len(data)
        return True

    def head(self, status: int = 200, content_type: str = "text/event-stream", length: int | None = None) -> bool:
        """The status line and headers; the body ends when the connection closes, unless length is given."""
        sized = f"Content-Length: {length}\r\n" if length is not None else ""
        return self.send(
            f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n{sized}Connection: close\r\n\r\n".encode()
        )

    def json(self, body, status: int = 200) -> bool:
        data = json.dumps(body).encode()
        return self.head(status, "application/json", len(data)) and self.send(data)

    def wait(self, seconds: float) -> bool:
        """Silence for seconds, or less: False as soon as the client has gone."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if select.select([self.sock], [], [], min(left, 0.02))[0]:
                try:
                    peeked = self.sock.recv(1, socket.MSG_PEEK)
                except OSError:
                    peeked = b""
                if not peeked:
                    self.gone.set()
                    return False
                time.sleep(0.02)
        return True


Route = Callable[[Conn], None]


def models_route(conn: Conn) -> None:
    conn.json({"object": "list", "data": [{"id": "hostile", "object": "model"}]})


class HostileServer:
    """An OpenAI-compatible server on 127.0.0.1 that does what its routes say ({"POST /v1/chat/completions":
    route(conn)}; /v1/models lists one model unless a route says otherwise; anything else is 404), one thread and
    one connection per request. Routes loop a bounded number of times, so they end by themselves; `conns` keeps
    each request's connection (bytes sent, whether the client went). Use it in a with block."""

    def __init__(self, routes: dict[str, Route]):
        self.routes = {"GET /v1/models": models_route, **routes}
        self.conns: dict[str, list[Conn]] = {}
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._handle(self.request)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "HostileServer":
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *_exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def last(self, route: str) -> Conn:
        return self.conns[route][-1]

    def _handle(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)  # little slack between sent and read
        data = b""
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            if not more:
                return
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        length = next(
            (int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:")), 0
        )
        while len(body) < length:
            more = sock.recv(65536)
            if not more:
                return
            body += more
        route = f"{method} {path}"
        conn = Conn(sock, body)
        self.conns.setdefault(route, []).append(conn)
        if route in self.routes:
            self.routes[route](conn)
        else:
            conn.json({"error": {"message": "no such route"}}, 404)
