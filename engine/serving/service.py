"""A running server: the engine thread (scheduler.py), the API (openai_api.py) and uvicorn on a thread
of its own, started and stopped as one. The command line (cli.py) and the window's Server panel use it."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..chat_format import ChatFormatter
from ..decoding.proposers.base import Proposer
from ..decoding.runtime import Model
from ..decoding.speculation_config import SpeculationConfig
from ..decoding.step_costs import StepCosts
from ..errors import EngineError, InvalidSettingError
from .api_config import MAX_BODY_BYTES, ApiConfig, RequestRecord
from .openai_api import create_app
from .request_guard import is_loopback
from .scheduler import Scheduler

log = logging.getLogger(__name__)
DEFAULT_PORT = 8765  # LM Studio has 1234, llama-server 8080, Ollama 11434
STARTUP_TIMEOUT_S = 30.0
STOP_WAIT_S = 120.0  # the most stop waits for a request still tokenizing (a liveness bound; it ends far sooner)
REQUEST_HEAD_TIMEOUT_S = 10.0  # from connecting (or the last answer) to a whole request line and headers
KEEP_ALIVE_S = 5  # an idle connection between requests (uvicorn's default)


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0: any free port
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    parallel: int = 4
    max_queue: int = 32
    max_body_bytes: int = MAX_BODY_BYTES
    allowed_hosts: tuple[str, ...] = ()  # names a request's Host may give beyond loopback (request_guard's docstring)

    def __post_init__(self) -> None:
        if not (isinstance(self.port, int) and 0 <= self.port <= 65535):
            raise InvalidSettingError(f"port must be 0..65535, got {self.port!r}")
        if not (isinstance(self.parallel, int) and 1 <= self.parallel <= 64):
            raise InvalidSettingError(f"parallel must be 1..64, got {self.parallel!r}")
        if not (isinstance(self.max_body_bytes, int) and self.max_body_bytes >= 1024):
            raise InvalidSettingError(f"max body must be at least 1 KB, got {self.max_body_bytes!r}")
        if not is_loopback(self.host) and not self.api_key:
            raise InvalidSettingError(f"Serving on {self.host} reaches other machines: set an API key.")
        for name in self.allowed_hosts:
            if not name or any(c.isspace() or c in "/@*" for c in name):
                raise InvalidSettingError(f"An allowed host must be a bare name or address, got {name!r}")
        if warning := self.open_to_every_page:  # said where every start's options are made: the command line
            log.warning(warning)  # before its model loads, the app at each Start (and its panel)

    @property
    def open_to_every_page(self) -> str | None:
        """The warning for CORS '*' without an API key, or None."""
        if "*" not in self.cors_origins or self.api_key:
            return None
        return (
            "Warning: CORS origin '*' without an API key lets every web page you visit use this server "
            "(run the model, read its answers). Set an API key, or list the origins that need it."
        )


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so a taken port is a clear error rather than uvicorn's exit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise EngineError(f"Could not listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the timeout it lacks: a connection that sends no whole request head (request
    line and headers) within REQUEST_HEAD_TIMEOUT_S of connecting, or of its last answer, is closed. uvicorn
    times out idle keep-alive connections only after a first answer, so a client that connects and says nothing,
    or one header byte a second, held a connection (and its memory) for good."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's own
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(REQUEST_HEAD_TIMEOUT_S, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered (its body has a deadline of its own); re-armed when it ends
        if not self.transport.is_closing():
            self.transport.close()


class Service:
    """Serves one loaded target until stop(); the target is the caller's again afterwards."""

    def __init__(
        self,
        target: Model,
        proposer: Proposer | None,
        speculation: SpeculationConfig,
        options: ServeOptions,
        model_id: str,
        step_costs: StepCosts | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
    ):
        if options.parallel > target.settings.n_seq_max:
            raise InvalidSettingError(
                f"parallel {options.parallel} exceeds the context's {target.settings.n_seq_max} sequences"
            )
        self.options = options
        self.scheduler = Scheduler(
            target, proposer, speculation, options.parallel, options.max_queue, step_costs=step_costs
        )
        self.api = ApiConfig(
            model_id,
            options.api_key,
            options.cors_origins,
            on_record,
            max_body_bytes=options.max_body_bytes,
            bind_host=options.host,
            allowed_hosts=options.allowed_hosts,
        )
        self.formatter = ChatFormatter(target)
        if self.formatter.template and self.formatter.refusal:
            log.warning("%s Chat requests will be refused; /v1/completions works.", self.formatter.refusal)
        app = create_app(self.scheduler, self.formatter, self.api)
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="warning",
                lifespan="off",
                http=TimedH11Protocol,
                timeout_keep_alive=KEEP_ALIVE_S,
                timeout_graceful_shutdown=1,
            )
        )
        self._thread: threading.Thread | None = None
        self.port = options.port

    @property
    def url(self) -> str:
        host = self.options.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self, engine_thread: bool = True) -> Service:
        """Listen and serve. engine_thread=False: the caller then runs self.scheduler.serve() on the thread
        that has driven the model so far (the app's worker: see Scheduler.serve), until stop()."""
        sock = listen(self.options.host, self.options.port)
        self.port = sock.getsockname()[1]
        if engine_thread:
            self.scheduler.start()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="specchat-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            self.stop()
            raise EngineError(f"The server did not start on {self.url}.")
        return self

    def stop(self) -> None:
        # The jobs first, while the event loop runs: each stream sends its last event (the server stopped
        # mid-answer) and ends, so uvicorn's graceful shutdown finds nothing to cut. The other way round, streams
        # were cut mid-chunk (the client saw "incomplete chunked read") and the engine met a closed loop.
        self.scheduler.stop()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        # A request still tokenizing in the thread pool reads the model: whoever closes the model after this must
        # not close it under that (bounded: a prompt's tokenizing and a template's sandboxed render end by limits).
        if not self.api.in_flight.wait_idle(STOP_WAIT_S):
            log.warning("the server stopped with a request still tokenizing after %s s", STOP_WAIT_S)
