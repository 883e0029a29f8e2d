"""A running server: the engine thread (scheduler.py), the API (openai_api.py) and uvicorn on a thread
of its own, started and stopped as one. The command line (cli.py) and the window's Server panel use it."""
from __future__ import annotations

import ipaddress
import socket
import threading
import time
from dataclasses import dataclass

import uvicorn

from ..chat_format import ChatFormatter
from ..decoding.cost_model import SpeculationConfig, StepCosts
from ..decoding.proposers.base import Proposer
from ..decoding.runtime import Model
from ..errors import InvalidSettingError, EngineError
from .openai_api import ApiConfig, create_app
from .scheduler import Scheduler

DEFAULT_PORT = 8765  # LM Studio has 1234, llama-server 8080, Ollama 11434
STARTUP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0: any free port
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    parallel: int = 4
    max_queue: int = 32

    def __post_init__(self) -> None:
        if not (isinstance(self.port, int) and 0 <= self.port <= 65535):
            raise InvalidSettingError(f"port must be 0..65535, got {self.port!r}")
        if not (isinstance(self.parallel, int) and 1 <= self.parallel <= 64):
            raise InvalidSettingError(f"parallel must be 1..64, got {self.parallel!r}")
        if not is_loopback(self.host) and not self.api_key:
            raise InvalidSettingError(f"Serving on {self.host} reaches other machines: set an API key.")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


class Service:
    """Serves one loaded target until stop(); the target is the caller's again afterwards."""

    def __init__(self, target: Model, proposer: Proposer | None, speculation: SpeculationConfig,
                 options: ServeOptions, model_id: str, step_costs: StepCosts | None = None, on_record=None):
        if options.parallel > target.settings.n_seq_max:
            raise InvalidSettingError(f"parallel {options.parallel} exceeds the context's {target.settings.n_seq_max} "
                                      "sequences")
        self.options = options
        self.scheduler = Scheduler(target, proposer, speculation, options.parallel, options.max_queue,
                                   step_costs=step_costs)
        self.api = ApiConfig(model_id, options.api_key, options.cors_origins, on_record)
        app = create_app(self.scheduler, ChatFormatter(target), self.api)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                                     timeout_graceful_shutdown=1))
        self._thread: threading.Thread | None = None
        self.port = options.port

    @property
    def url(self) -> str:
        host = self.options.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self, engine_thread: bool = True) -> "Service":
        """Listen and serve. engine_thread=False: the caller then runs self.scheduler.serve() on the thread
        that has driven the model so far (the app's worker: see Scheduler.serve), until stop()."""
        sock = listen(self.options.host, self.options.port)
        self.port = sock.getsockname()[1]
        if engine_thread:
            self.scheduler.start()
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="specchat-http",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            self.stop()
            raise EngineError(f"The server did not start on {self.url}.")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self.scheduler.stop()
        if self._thread is not None:
            self._thread.join(10)
