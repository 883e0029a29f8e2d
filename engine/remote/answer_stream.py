"""One streamed answer from a remote server (client.py starts it): its text pieces, the figures measured here,
and its acceptance as the server reports it, best first: llama-server's and SpecChat's `timings` in the last chunk;
vLLM's per-request `metrics.speculative_decoding` (with --per-request-spec-decode-metrics); vLLM's /metrics counters
before and after the answer (prometheus.py says when that is uncertain).

The server is not trusted: the answer ends here at its max_tokens and a margin, whatever the server sends; Stop ends
it within CANCEL_POLL_S whatever the server does (the request runs on a thread of its own, _Pump); an answer with no
new event for the engine's read_timeout_s is given up, however many bytes trickle in.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from ..errors import EngineError
from . import prometheus
from .reading import CONNECT_TIMEOUT_S, MAX_ERROR_BYTES, MAX_SHOWN_CHARS, cut, reach_error, read_capped, status_error
from .sse import DONE, MAX_LINE_BYTES, EventStream, parse_chunk

if TYPE_CHECKING:
    from .client import RemoteEngine

T = TypeVar("T")
CANCEL_POLL_S = 0.25  # the longest an answer waits on the server without looking at Stop
RATE_EVERY_S = 0.25  # the sparkline's points
BYTES_PER_EVENT = 16 << 10  # a stream's bytes, per event it may hold, over one line's: pings, comments, usage
EXTRA_EVENTS = 16  # an answer's events over max_tokens (or a quarter more): a role chunk, the finish, the usage
MAX_CHARS_PER_TOKEN = 64  # an answer's text, per event it may hold: a token is rarely 20 characters
PUMP_CHUNKS = 16  # read ahead of the answer: 64 kB each at most


@dataclass
class RemoteFigures:
    """One remote answer's figures, in the keys the window shows for a local one."""

    backend: str
    model: str
    prompt_tokens: int | None = None
    generated: int = 0
    ttft_s: float | None = None
    decode_s: float = 0.0
    drafted: float | None = None  # a counter the server reports (a float in Prometheus' figures)
    accepted: float | None = None
    mean_acceptance_length: float | None = None
    per_position_acceptance: list[float] = field(default_factory=list)
    server_method: str | None = None  # what the server says it speculates with (SpecChat's servers say)
    acceptance_source: str = "the server reports no speculation figures"
    finish_reason: str | None = None
    rate_history: list[tuple[float, float]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float | None:
        return (self.generated - 1) / self.decode_s if self.generated >= 2 and self.decode_s > 0 else None

    def to_dict(self) -> dict:
        """The figures as plain data: exactly engine.figures' REMOTE keys (tests/engine/test_figures.py)."""
        rate = self.accepted / self.drafted if self.drafted and self.accepted is not None else None
        return {
            "remote": True,
            "network_included": True,
            "backend": self.backend,
            "model": self.model,
            "method": self.server_method or "remote",
            "prompt_tokens": self.prompt_tokens,
            "generated": self.generated,
            "ttft_s": self.ttft_s,
            "decode_s": self.decode_s,
            "tokens_per_s": self.tokens_per_s,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_acceptance": self.per_position_acceptance,
            "acceptance_source": self.acceptance_source,
            "memory_label": "n/a (remote)",
            "memory_bytes": None,
            "memory_kind": None,
            "finish_reason": self.finish_reason,
            "rate_history": list(self.rate_history),
        }


class RemoteAnswer:
    """Iterate for the answer's text pieces; `figures` fill in as they come. A reasoning model's thought
    (vLLM's and llama-server's reasoning_content) comes as <think>…</think>, as local models write it.

    The answer ends here, as "length", once the server has sent more events than max_tokens allows (plus
    EXTRA_EVENTS or a quarter) or more text than MAX_CHARS_PER_TOKEN per event; at Stop within CANCEL_POLL_S;
    and with an EngineError after the engine's read_timeout_s without a new event (a byte now and then is none)."""

    def __init__(self, engine: RemoteEngine, body: dict, figures: RemoteFigures, cancel: threading.Event):
        self.engine, self.body, self.figures, self.cancel = engine, body, figures, cancel
        self._thinking = False
        self._timings: dict | None = None
        self._spec_metrics: dict | None = None
        self._max_events = body["max_tokens"] + max(EXTRA_EVENTS, body["max_tokens"] // 4)
        self._max_chars = self._max_events * MAX_CHARS_PER_TOKEN
        self._events = self._chars = 0
        self._sent: float | None = None  # when the request went (_stream sets it)
        self._first: float | None = None
        self._last_point: float | None = None
        self.on_wait: Callable[[], None] | None = None  # called on the answer's thread while the server is quiet

    def __iter__(self):
        f = self.figures
        pump = _Pump(self.engine, self.body)
        try:
            yield from self._stream(pump)
        finally:
            pump.stop()
        if self._thinking:
            yield "</think>"
        if f.finish_reason is None and self.cancel.is_set():
            f.finish_reason = "cancelled"
        if f.finish_reason is None:  # no finish reason and no [DONE]: the connection ended mid-answer
            raise EngineError(
                f"{self.engine.endpoint.url} ended the answer without finishing it (the connection "
                "closed); the text so far is kept."
            )
        # A stopped answer's counters are not asked for again: Stop is not to wait on /metrics.
        self._acceptance(pump.before if f.finish_reason != "cancelled" else None)

    def _stream(self, pump: _Pump):
        """The text pieces of the events in the pump's bytes, until the answer ends, Stop, or the cap."""
        url, events = self.engine.endpoint.url, EventStream(MAX_LINE_BYTES + self._max_events * BYTES_PER_EVENT)
        self._sent = last_event = time.perf_counter()
        while not self.cancel.is_set():
            if time.perf_counter() - last_event > self.engine.read_timeout_s:
                raise EngineError(
                    f"{url} sent nothing new for {self.engine.read_timeout_s:g} s, so SpecChat stopped "
                    "waiting; the text so far is kept."
                )
            item = pump.get(CANCEL_POLL_S)
            if item is None and self.on_wait is not None:
                self.on_wait()
            if item is None or self.cancel.is_set():
                continue
            kind, value = item
            if kind == "end":
                return
            if kind != "bytes":
                self._failed(kind, value, mid_answer=self._events > 0)
            assert isinstance(value, bytes)  # what a "bytes" item carries
            try:
                datas = events.feed(value)
            except ValueError as exc:
                raise EngineError(f"{url} sent {exc}, so SpecChat stopped reading; the text so far is kept.") from None
            for data in datas:
                last_event = time.perf_counter()
                if self.cancel.is_set():
                    break
                chunk = parse_chunk(data)
                if chunk is DONE:
                    return
                if chunk is not None:
                    text, full = self._take(chunk)
                    if text:
                        yield text
                    if full:
                        return
        self.figures.finish_reason = "cancelled"  # the loop ends only at Stop

    def _failed(self, kind: str, value, mid_answer: bool) -> None:
        """Raise what the pump met: the server's error status, or the connection's failure."""
        url = self.engine.endpoint.url
        if mid_answer and isinstance(value, (httpx.RemoteProtocolError, httpx.ReadError)):
            # httpx says "peer closed connection without sending complete message body (incomplete chunked read)"
            raise EngineError(
                f"{url} closed the connection mid-answer (the server stopped, or the network "
                "failed); the text so far is kept."
            ) from value
        if kind == "status":
            status, body = value
            raise EngineError(status_error(url + "/v1/chat/completions", status, body.decode("utf-8", "replace")))
        if isinstance(value, httpx.HTTPError):
            raise reach_error(url, value) from value
        raise value

    def _take(self, chunk: dict) -> tuple[str, bool]:
        """One chunk's text, cut to what the answer may still hold, and whether the answer is at its cap."""
        f = self.figures
        text = self._read(chunk)[: self._max_chars - self._chars]
        self._chars += len(text)
        self._events += 1
        if text:
            self._timed(chunk)
        full = self._events >= self._max_events or self._chars >= self._max_chars or f.generated > self._max_events
        if full:
            f.finish_reason = "length"  # ended here: the server went on past the max_tokens it was asked for
        return text, full

    def _timed(self, chunk: dict) -> None:
        f, now = self.figures, time.perf_counter()
        first = self._first = self._first or now
        assert self._sent is not None  # set as the stream began
        f.ttft_s = first - self._sent
        f.decode_s = now - first
        usage = chunk.get("usage")
        if not (isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int)):
            f.generated += 1  # a server without running usage: one chunk, one token (llama-server)
        if self._last_point is None or now - self._last_point >= RATE_EVERY_S:
            self._last_point = now
            if f.tokens_per_s is not None:
                f.rate_history.append((now - first, f.tokens_per_s))

    def _read(self, chunk: dict) -> str:
        """The text in one chunk; usage, timings and the finish reason noted."""
        f = self.figures
        if isinstance(chunk.get("error"), (dict, str)):
            error = chunk["error"]
            said = error.get("message") if isinstance(error, dict) else error
            said = cut(" ".join(str(said).split()), MAX_SHOWN_CHARS)
            raise EngineError(f"{self.engine.endpoint.url} ended the answer: “{said}”")  # its words, quoted
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                f.generated = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                f.prompt_tokens = usage["prompt_tokens"]
        if isinstance(chunk.get("timings"), dict):
            self._timings = chunk["timings"]
        metrics = chunk.get("metrics")
        if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
            self._spec_metrics = metrics["speculative_decoding"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise EngineError(self._odd("choices", choices, "a list"))
        if not choices or not isinstance(choices[0], dict):
            return ""
        choice = choices[0]
        if choice.get("finish_reason"):
            f.finish_reason = "length" if choice["finish_reason"] == "length" else "stop"
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise EngineError(self._odd("delta", delta, "an object"))
        thought = self._text(delta, "reasoning_content") or self._text(delta, "reasoning")
        content = self._text(delta, "content")
        text = ""
        if thought:
            text += ("" if self._thinking else "<think>") + thought
            self._thinking = True
        if content:
            text += ("</think>" if self._thinking else "") + content
            self._thinking = False
        return text

    def _text(self, delta: dict, key: str) -> str:
        """delta[key] as text: null or missing is none (OpenAI's deltas say null); anything but text an error."""
        value = delta.get(key)
        if value is None or isinstance(value, str):
            return value or ""
        raise EngineError(self._odd(f"delta {key}", value, "text"))

    def _odd(self, what: str, value, wanted: str) -> str:
        return (
            f"{self.engine.endpoint.url} sent a chunk whose {what} was {_json_kind(value)}, not {wanted}; "
            "SpecChat cannot read that answer. The text so far is kept."
        )

    def _acceptance(self, before: prometheus.SpecCounters | None) -> None:
        f, t, m = self.figures, self._timings, self._spec_metrics
        if t is not None:
            f.server_method = t.get("method") if isinstance(t.get("method"), str) else None
            if isinstance(t.get("draft_n"), int):
                f.drafted, f.accepted = t["draft_n"], _number(t.get("draft_n_accepted")) or 0
                f.mean_acceptance_length = _number(t.get("mean_acceptance_length"))
                f.acceptance_source = "from the server's timings for this answer"
            if isinstance(t.get("predicted_n"), int) and not f.generated:
                f.generated = t["predicted_n"]
            if f.drafted is not None:
                return
        if m is not None:
            f.drafted, f.accepted = _number(m.get("num_draft_tokens")), _number(m.get("num_accepted_draft_tokens"))
            f.mean_acceptance_length = _number(m.get("mean_acceptance_length"))
            f.acceptance_source = "from the server's per-request metrics (vLLM) for this answer"
            return
        if before is not None:
            after = interruptible(self.engine.spec_counters, self.cancel)  # Stop does not wait on /metrics
            moved = prometheus.delta(before, after) if after is not None else None
            if moved is not None:
                f.drafted, f.accepted = moved.drafted, moved.accepted
                f.mean_acceptance_length = moved.mean_acceptance_length
                f.per_position_acceptance = moved.per_position_acceptance
                f.acceptance_source = moved.note()


class _Pump:
    """An answer's request on a thread of its own, its body handed over as it comes. httpx's reads block until
    their timeout, whatever Stop says, so the answer's thread waits on this at most CANCEL_POLL_S at a time; stop()
    shuts the connection's socket, which ends a read still waiting (the server sees the client gone) without
    closing it under the reading thread. The spec-decode counters before the answer are read here too."""

    def __init__(self, engine: RemoteEngine, body: dict):
        self.engine, self.body = engine, body
        self.before: prometheus.SpecCounters | None = None
        self._items: queue.Queue = queue.Queue(maxsize=PUMP_CHUNKS)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._socket = None
        threading.Thread(target=self._run, daemon=True, name="remote-answer-read").start()

    def get(self, timeout: float) -> tuple[str, object] | None:
        """("bytes", b), ("status", (code, body)), ("error", exception), ("end", None), or None for nothing yet."""
        try:
            return self._items.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> None:
        with self._lock:  # held while shutting: the socket cannot go back to the pool meanwhile
            self._stopped.set()
            _shut(self._socket)
            self._socket = None

    def _run(self) -> None:
        try:
            self.before = self.engine.spec_counters()
            if self._stopped.is_set():
                return
            # The answer's own deadline (no new event) comes first; this one only ends a thread left waiting.
            timeout = httpx.Timeout(self.engine.read_timeout_s + 1.0, connect=CONNECT_TIMEOUT_S)
            with self.engine.http.stream("POST", "/v1/chat/completions", json=self.body, timeout=timeout) as response:
                self._hold(response)
                try:
                    self._pass(response)
                finally:
                    with self._lock:
                        self._socket = None  # not shut once the connection may be back in the pool
        except Exception as exc:  # noqa: BLE001 - handed to the answer's thread, which raises it
            self._put(("error", exc))

    def _hold(self, response: httpx.Response) -> None:
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        with self._lock:
            if self._stopped.is_set():
                _shut(sock)
            else:
                self._socket = sock

    def _pass(self, response: httpx.Response) -> None:
        if response.status_code != 200:
            body, _more = read_capped(response, MAX_ERROR_BYTES)
            self._put(("status", (response.status_code, body)))
            return
        for data in response.iter_bytes():
            if not self._put(("bytes", data)):
                return
        self._put(("end", None))

    def _put(self, item) -> bool:
        """item handed over, or False once stopped (the answer's thread reads no more)."""
        while not self._stopped.is_set():
            try:
                self._items.put(item, timeout=CANCEL_POLL_S)
                return True
            except queue.Full:
                continue
        return False


def interruptible(call: Callable[[], T], cancel: threading.Event) -> T | None:
    """call() on a thread of its own, waited on CANCEL_POLL_S at a time: its result (or its exception), or None
    as soon as cancel is set (the thread is left to end by its own timeouts)."""
    done = threading.Event()
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
            out["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="remote-call").start()
    while not done.wait(CANCEL_POLL_S):
        if cancel.is_set():
            return None
    if "error" in out:
        raise out["error"]
    return out["result"]


def _shut(sock) -> None:
    """End whatever waits on sock, from any thread: shutdown wakes a blocked read, where close may not."""
    if sock is None:
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's: an SSLSocket's drops its state
    except (OSError, TypeError, ValueError):
        pass


def _number(value: object) -> float | None:
    """A figure the server gave, if it is a number (anything else is not shown)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    kinds: dict[type, str] = {list: "a list", dict: "an object", str: "text"}
    return kinds.get(type(value), type(value).__name__)
