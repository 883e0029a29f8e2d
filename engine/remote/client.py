"""An OpenAI-compatible server elsewhere (vLLM, llama-server, a SpecChat server): its models, a streamed chat
answer with figures measured here, and the prompt's size by the server's own tokenizer where it has one.

Speed and time to first token are timed on this machine, so they include the network. Acceptance comes from
the server, whichever way it reports it, best first: llama-server's and SpecChat's `timings` in the last chunk;
vLLM's per-request `metrics.speculative_decoding` (with --per-request-spec-decode-metrics); vLLM's /metrics
counters before and after the answer (prometheus.py says when that is uncertain). Memory is the server's: n/a.

A server is not trusted to behave. Every body is read to a cap (a line of the stream, an error, the model list,
/metrics); an answer ends here at its max_tokens and a margin, whatever the server sends; Stop ends it within
CANCEL_POLL_S whatever the server does (the request runs on a thread of its own, _Pump); an answer with no new
event for read_timeout_s is given up, however many bytes trickle in; the stream is parsed as the SSE spec says.
"""

from __future__ import annotations

import logging
import queue
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from .. import text_rules
from ..decoding.sampling import SamplingParams
from ..errors import EngineError
from . import prometheus
from .endpoint import Endpoint

log = logging.getLogger(__name__)
T = TypeVar("T")
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0  # with no new event: a big prompt's prefill on a busy server can take minutes
QUICK_TIMEOUT_S = 10.0  # /v1/models, /tokenize, /metrics, start to end (a byte a second must not keep one open)
CANCEL_POLL_S = 0.25  # the longest an answer waits on the server without looking at Stop
RATE_EVERY_S = 0.25  # the sparkline's points
CHARS_PER_TOKEN = 4  # the estimate when a server cannot count: labelled as one wherever it is shown
MIB = 1 << 20
# What is read of a server, whatever it sends (it may be broken, or hostile):
MAX_LINE_BYTES = MIB  # a line or event of the stream: a real chunk is a few tokens' JSON, a few kB with logprobs
BYTES_PER_EVENT = 16 << 10  # a stream's bytes, per event it may hold, over one line's: pings, comments, usage
MAX_ERROR_BYTES = 64 << 10  # an error's body: only its message is shown
MAX_SHOWN_CHARS = 300  # of a server's own words in a message
MAX_JSON_BYTES = 8 * MIB  # /v1/models, /tokenize: hundreds of models with their descriptions take a few MiB
MAX_METRICS_BYTES = 8 * MIB  # vLLM's /metrics is a few hundred kB; past this the counters are not used
MAX_MODELS = 1000  # listed (a model named is looked for among all)
MAX_MODEL_ID_CHARS = 512  # a longer id is no model's name: not listed
EXTRA_EVENTS = 16  # an answer's events over max_tokens (or a quarter more): a role chunk, the finish, the usage
MAX_CHARS_PER_TOKEN = 64  # an answer's text, per event it may hold: a token is rarely 20 characters
PUMP_CHUNKS = 16  # read ahead of the answer: 64 kB each at most


@dataclass(frozen=True)
class RemoteModel:
    id: str
    n_ctx: int | None  # the context a request may use, where the server says
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PromptCount:
    tokens: int
    n_ctx: int | None
    exact: bool  # counted by the server's own template and tokenizer (else an estimate from characters)


@dataclass
class RemoteFigures:
    """One remote answer's figures, in the keys the window shows for a local one."""

    backend: str
    model: str
    prompt_tokens: int | None = None
    generated: int = 0
    ttft_s: float | None = None
    decode_s: float = 0.0
    drafted: int | None = None
    accepted: int | None = None
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
        rate = self.accepted / self.drafted if self.drafted else None
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


class RemoteEngine:
    """One server. Thread-safe enough for one answer at a time plus quick calls (httpx.Client is).
    read_timeout_s: how long an answer may go without a new event before it is given up."""

    def __init__(self, endpoint: Endpoint, read_timeout_s: float = READ_TIMEOUT_S):
        self.endpoint = endpoint
        self.read_timeout_s = read_timeout_s
        # identity: the caps count bytes as they arrive; a compressed body would grow past them inside one read
        headers = {"Accept-Encoding": "identity"}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        self.http = httpx.Client(
            base_url=endpoint.url,
            headers=headers,
            follow_redirects=False,
            timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        )
        self._has_spec_metrics: bool | None = None  # unknown until /metrics is read once

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # --- quick calls --------------------------------------------------------------------------------
    def models(self) -> list[RemoteModel]:
        """The server's models, the first MAX_MODELS of them."""
        return self._listing()[:MAX_MODELS]

    def model(self) -> RemoteModel:
        """The endpoint's model (the first the server lists, when none is named)."""
        models = self._listing()
        if not self.endpoint.model:
            return models[0]
        for m in models:
            if m.id == self.endpoint.model:
                return m
        raise EngineError(
            f"{self.endpoint.url} does not serve “{_cut(self.endpoint.model, 100)}”; it serves "
            f"{_some([m.id for m in models])}."
        )

    def _listing(self) -> list[RemoteModel]:
        body = self._json("GET", "/v1/models", MAX_JSON_BYTES)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise EngineError(f"{self.endpoint.url}/v1/models did not list models: is it an OpenAI-compatible server?")
        out = [model for model in map(_listed_model, data) if model is not None]
        if not out:
            raise EngineError(f"{self.endpoint.url} serves no models.")
        return out

    def count_prompt(self, messages: list[dict], model: RemoteModel) -> PromptCount:
        """The conversation's size as the server will see it: vLLM's and SpecChat's /tokenize take the messages;
        llama-server's /apply-template then /tokenize; else an estimate from its characters."""
        body = self._post_json("/tokenize", {"model": model.id, "messages": messages}, quiet=True)
        if isinstance(body, dict) and isinstance(body.get("count"), int):
            n_ctx = body.get("max_model_len")
            return PromptCount(body["count"], n_ctx if isinstance(n_ctx, int) else model.n_ctx, True)
        templated = self._post_json("/apply-template", {"messages": messages}, quiet=True)
        if isinstance(templated, dict) and isinstance(templated.get("prompt"), str):
            tokens = self._post_json("/tokenize", {"content": templated["prompt"], "add_special": True}, quiet=True)
            if isinstance(tokens, dict) and isinstance(tokens.get("tokens"), list):
                return PromptCount(len(tokens["tokens"]), model.n_ctx, True)
        chars = sum(len(str(m.get("content", ""))) for m in messages)
        return PromptCount(-(-chars // CHARS_PER_TOKEN), model.n_ctx, False)

    def spec_counters(self) -> prometheus.SpecCounters | None:
        """vLLM's spec-decode counters now, or None where the server has none (then it is not asked again).
        /metrics too long, too slow or with too many series counts as none."""
        if self._has_spec_metrics is False:
            return None
        try:
            status, body = self._fetch("GET", "/metrics", MAX_METRICS_BYTES)
            counters = prometheus.SpecCounters.from_text(body.decode("utf-8", "replace")) if status == 200 else None
        except (EngineError, ValueError):
            counters = None
        self._has_spec_metrics = counters is not None and counters.speculates
        return counters if self._has_spec_metrics else None

    def _post_json(self, path: str, body: dict, quiet: bool = False):
        """The JSON answer; with quiet, None for any failure (an endpoint this server lacks)."""
        try:
            return self._json("POST", path, MAX_JSON_BYTES, json=body)
        except EngineError:
            if quiet:
                return None
            raise

    def _json(self, method: str, path: str, limit: int, **kwargs):
        status, body = self._fetch(method, path, limit, **kwargs)
        if status != 200:
            raise EngineError(status_error(self.endpoint.url + path, status, body.decode("utf-8", "replace")))
        try:
            return text_rules.loads(body)  # every string valid text; nesting too deep is a ValueError
        except ValueError:
            raise EngineError(f"{self.endpoint.url}{path} did not answer JSON.") from None

    def _fetch(self, method: str, path: str, limit: int, **kwargs) -> tuple[int, bytes]:
        """A quick call's status and body, the body read to limit (MAX_ERROR_BYTES of an error's), all within
        QUICK_TIMEOUT_S; EngineError where the server is not reached, too slow, or answers more than limit."""
        url = self.endpoint.url + path
        deadline = time.monotonic() + QUICK_TIMEOUT_S
        try:
            with self.http.stream(method, path, timeout=QUICK_TIMEOUT_S, **kwargs) as response:
                status = response.status_code
                body, more = read_capped(response, limit if status == 200 else MAX_ERROR_BYTES, deadline)
        except httpx.HTTPError as exc:
            raise reach_error(self.endpoint.url, exc) from exc
        except TimeoutError:
            raise EngineError(f"{url} did not answer within {QUICK_TIMEOUT_S:g} s.") from None
        if more and status == 200:
            raise EngineError(f"{url} answered more than {limit / MIB:g} MiB; SpecChat reads no more than that.")
        return status, body

    # --- answers --------------------------------------------------------------------------------
    def answer(
        self,
        messages: list[dict],
        sampling: SamplingParams,
        max_tokens: int,
        model: RemoteModel,
        cancel: threading.Event | None = None,
        continue_last: bool = False,
    ) -> RemoteAnswer:
        body = {
            "model": model.id,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if continue_last:  # vLLM's names; llama-server continues a last assistant message by itself
            body.update(continue_final_message=True, add_generation_prompt=False)
        served_by = f" · {_cut(str(model.meta['backend']), 64)}" if model.meta.get("backend") else ""
        backend = f"remote {self.endpoint.host}{served_by}"
        return RemoteAnswer(self, body, RemoteFigures(backend=backend, model=model.id), cancel or threading.Event())


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
        self._sent = self._first = self._last_point = None
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
            try:
                datas = events.feed(value)
            except ValueError as exc:
                raise EngineError(f"{url} sent {exc}, so SpecChat stopped reading; the text so far is kept.") from None
            for data in datas:
                last_event = time.perf_counter()
                if self.cancel.is_set():
                    break
                chunk = _chunk(data)
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
        self._first = self._first or now
        f.ttft_s = self._first - self._sent
        f.decode_s = now - self._first
        usage = chunk.get("usage")
        if not (isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int)):
            f.generated += 1  # a server without running usage: one chunk, one token (llama-server)
        if self._last_point is None or now - self._last_point >= RATE_EVERY_S:
            self._last_point = now
            if f.tokens_per_s is not None:
                f.rate_history.append((now - self._first, f.tokens_per_s))

    def _read(self, chunk: dict) -> str:
        """The text in one chunk; usage, timings and the finish reason noted."""
        f = self.figures
        if isinstance(chunk.get("error"), (dict, str)):
            error = chunk["error"]
            said = error.get("message") if isinstance(error, dict) else error
            said = _cut(" ".join(str(said).split()), MAX_SHOWN_CHARS)
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


_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
DONE = "[DONE]"


class EventStream:
    """Server-sent events, parsed as the WHATWG spec says, from bytes as they come: lines end at CR, LF or CRLF
    and nowhere else (a JSON string may hold U+2028 or U+0085, at which str.splitlines would split); an empty line
    ends an event, whose data lines are joined with LF; comments (":", servers' pings), event names, ids and retry
    times are ignored; an event not ended when the stream ends is dropped. ValueError for a line or an event over
    MAX_LINE_BYTES, or more than max_total bytes in all."""

    def __init__(self, max_total: int):
        self.max_total = max_total
        self._line = bytearray()  # the line so far
        self._data: list[bytes] = []  # the event's data lines so far
        self._data_bytes = self._total = 0
        self._after_cr = False  # the last chunk ended with CR: an LF starting the next ends no other line
        self._start = True

    def feed(self, chunk: bytes) -> list[str]:
        """The data of each event chunk completes."""
        self._total += len(chunk)
        if self._total > self.max_total:
            raise ValueError(f"more than {self.max_total:,} bytes, more than an answer of this length takes")
        if self._start and chunk:
            chunk, self._start = chunk.removeprefix(_BOM), False
        at = 1 if self._after_cr and chunk[:1] == b"\n" else 0
        self._after_cr = False
        events = []
        for end in _LINE_END.finditer(chunk, at):
            self._line += chunk[at : end.start()]
            self._check(len(self._line), "a line")
            event = self._line_ended(bytes(self._line))
            self._line.clear()
            if event is not None:
                events.append(event)
            at = end.end()
            self._after_cr = end.group() == b"\r" and at == len(chunk)
        self._line += chunk[at:]
        self._check(len(self._line), "a line")
        return events

    def _line_ended(self, line: bytes) -> str | None:
        if not line:
            if not self._data:
                return None
            data, self._data, self._data_bytes = b"\n".join(self._data), [], 0
            return data.decode("utf-8", "replace")
        if line.startswith(b":"):
            return None
        name, _, value = line.partition(b":")
        if name == b"data":
            value = value[1:] if value.startswith(b" ") else value
            self._data_bytes += len(value) + 1
            self._check(self._data_bytes, "an event")
            self._data.append(value)
        return None

    @staticmethod
    def _check(size: int, what: str) -> None:
        if size > MAX_LINE_BYTES:
            raise ValueError(f"{what} over {MAX_LINE_BYTES / MIB:g} MiB")


def _chunk(data: str):
    """One event's JSON object, DONE, or None for anything else (a ping, data that is no JSON object)."""
    data = data.strip()
    if data == DONE:
        return DONE
    try:
        chunk = text_rules.loads(data)  # a lone surrogate in an answer becomes U+FFFD: it can be saved
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


def read_capped(response: httpx.Response, limit: int, deadline: float | None = None) -> tuple[bytes, bool]:
    """Up to limit bytes of response's body, and whether it had more (which is not read); TimeoutError once
    time.monotonic() passes deadline (a server sending a byte now and then restarts httpx's read timeout)."""
    body = bytearray()
    for data in response.iter_bytes():
        body += data
        if len(body) > limit:
            return bytes(body[:limit]), True
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError
    return bytes(body), False


def interruptible(call: Callable[[], T], cancel: threading.Event) -> T | None:
    """call() on a thread of its own, waited on CANCEL_POLL_S at a time: its result (or its exception), or None
    as soon as cancel is set (the thread is left to end by its own timeouts)."""
    done, out = threading.Event(), {}

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


def _listed_model(item) -> RemoteModel | None:
    if not (isinstance(item, dict) and isinstance(item.get("id"), str) and 0 < len(item["id"]) <= MAX_MODEL_ID_CHARS):
        return None
    meta = item.get("meta") if isinstance(item.get("meta"), dict) else {}
    n_ctx = item.get("max_model_len") or meta.get("n_ctx")  # vLLM's, llama-server's and SpecChat's
    return RemoteModel(item["id"], n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None, meta)


def _number(value) -> int | float | None:
    """A figure the server gave, if it is a number (anything else is not shown)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return {list: "a list", dict: "an object", str: "text"}.get(type(value), type(value).__name__)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _some(names: list[str]) -> str:
    """names, as many as fit in about MAX_SHOWN_CHARS, and how many more there are."""
    shown, size = [], 0
    for name in names:
        if shown and size + len(name) > MAX_SHOWN_CHARS:
            break
        shown.append(_cut(name, MAX_SHOWN_CHARS))
        size += len(name) + 2
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" and {rest:,} more" if rest else "")


def reach_error(url: str, exc: httpx.HTTPError) -> EngineError:
    if isinstance(exc, httpx.ConnectError) and "CERTIFICATE" in str(exc).upper():
        return EngineError(
            f"{url}'s certificate could not be verified ({exc}): SpecChat only talks to https "
            "servers whose certificate checks out."
        )
    if isinstance(exc, httpx.ConnectError):
        return EngineError(f"Could not reach {url} ({exc}). Is the server running, and the address right?")
    if isinstance(exc, httpx.TimeoutException):
        return EngineError(f"{url} did not answer in time ({type(exc).__name__}).")
    return EngineError(f"The connection to {url} failed: {type(exc).__name__}: {_cut(str(exc), MAX_SHOWN_CHARS)}")


def status_error(url: str, status: int, text: str) -> str:
    """A person's message for an HTTP error, with the server's own words where it gave some (the body is read to
    MAX_ERROR_BYTES, the words cut to MAX_SHOWN_CHARS)."""
    said = text.strip()
    try:
        body = text_rules.loads(said)
        error = body.get("error", body) if isinstance(body, dict) else body
        said = error.get("message") or error.get("detail") or said if isinstance(error, dict) else str(error)
    except ValueError:
        pass
    said = _cut(" ".join(str(said).split()), MAX_SHOWN_CHARS)
    if status == 401 or status == 403:
        return f"{url} refused the API key (HTTP {status}). Set the right key in the chat's settings. {said}".strip()
    return f"{url} answered HTTP {status}" + (f": {said}" if said else ".")
