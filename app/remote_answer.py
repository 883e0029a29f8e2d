"""A chat answer from a remote engine (engine/remote), on a thread of its own: RemoteAnswers, one of the answer
path's sources (app/answers.py), so the chat, Stop, Regenerate and the figures work as they do for this machine's
answers, and the local engine stays free (it may be loading, or serving). Also the servers kept for the run, their
API keys, and asking a server something off the GUI thread (the engine picker's model list, the context meter).

API keys: the one given for this run (the chat settings when no keyring works, or --api-key-env) first, else
the one saved in the system keyring for the server's URL. Looked up here, not on the GUI thread (a keyring
may wait on D-Bus)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject

from app.background import Job, run_in_background
from app.progress import rate_points
from engine.errors import EngineError
from engine.remote.answer_stream import RemoteFigures, interruptible
from engine.remote.client import RemoteEngine
from engine.remote.endpoint import Endpoint
from engine.remote.keys import saved_key
from engine.text_rules import plain_name

_run_keys: dict[str, str] = {}  # url → key, for this run only
_servers: dict[Endpoint, RemoteEngine] = {}  # server_for's
_lock = threading.Lock()


def use_key_for_this_run(url: str, key: str) -> None:
    with _lock:
        if key:
            _run_keys[url] = key
        else:
            _run_keys.pop(url, None)


def api_key(url: str) -> str | None:
    with _lock:
        key = _run_keys.get(url)
    return key or saved_key(url)


def with_key(endpoint: Endpoint) -> Endpoint:
    return endpoint if endpoint.api_key else Endpoint(endpoint.url, endpoint.model, api_key(endpoint.url))


def server_for(endpoint: Endpoint) -> RemoteEngine:
    """One RemoteEngine per server, key and model, kept for the run: its connections are reused (an https
    handshake per answer and per context count otherwise), and what it learnt once (a server without spec-decode
    counters) is not asked again before every answer."""
    endpoint = with_key(endpoint)
    with _lock:
        if endpoint not in _servers:
            _servers[endpoint] = RemoteEngine(endpoint)
        return _servers[endpoint]


def ask_server(
    endpoint: Endpoint,
    question: Callable[[RemoteEngine], object],
    answer: Callable[[object], None],
    name: str,
    owner: QObject | None = None,
) -> Job:
    """question(server) off the GUI thread (a server far away must not freeze the window), then answer(its result),
    or answer(why it failed, as text), on the GUI thread; not once owner is gone. A daemon job (app.background): a
    server that never answers does not keep the app from quitting."""

    def ask() -> object:
        try:
            return question(server_for(endpoint))
        except Exception as exc:  # noqa: BLE001 - told to the person, whatever it is
            return str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"

    return run_in_background(ask, done=answer, owner=owner, daemon=True, name=name)


def model_label(model_id: str) -> str:
    """A server's model id as the window shows it: a file path (llama-server names its model so) by its name."""
    looks_like_path = (
        model_id.startswith(("/", "~", "\\"))
        or model_id.lower().endswith(".gguf")
        or re.match(r"^[A-Za-z]:[\\/]", model_id) is not None
    )
    # A name a server chose: no bidi control may make it read as another (engine.text_rules).
    return plain_name(re.split(r"[\\/]", model_id)[-1] if looks_like_path else model_id)


def figures(stats: dict) -> dict:
    return {**stats, "rate_history": rate_points(stats.get("rate_history"))}


class RemoteAnswers:
    """An answer source (app/answers.py): the request's server answers, on a thread of its own."""

    failure, what = "The remote answer failed", "a remote answer"

    def answer(self, request, out) -> None:
        engine = server_for(request.remote)
        model = interruptible(engine.model, request.cancel)  # Stop does not wait on the server's model list
        if model is None:
            stopped = RemoteFigures(backend=f"remote {engine.endpoint.host}", model="", finish_reason="cancelled")
            out.finish(figures(stopped.to_dict()))
            return
        answer = engine.answer(
            request.messages,
            request.sampling,
            request.max_tokens,
            model,
            request.cancel,
            continue_last=request.continue_last,
        )
        out.figures = lambda: figures(answer.figures.to_dict())
        answer.on_wait = out.show_held  # the batch's text shown once the server goes quiet, not at its next piece
        for text in answer:
            out.add([(text, False)])
        out.finish(out.figures())
