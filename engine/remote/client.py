"""An OpenAI-compatible server elsewhere (vLLM, llama-server, a SpecChat server): its models, a streamed chat
answer with figures measured here, and the prompt's size by the server's own tokenizer where it has one.

Speed and time to first token are timed on this machine, so they include the network. Acceptance comes from
the server, whichever way it reports it, best first: llama-server's and SpecChat's `timings` in the last chunk;
vLLM's per-request `metrics.speculative_decoding` (with --per-request-spec-decode-metrics); vLLM's /metrics
counters before and after the answer (prometheus.py says when that is uncertain). Memory is the server's: n/a.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field

import httpx

from ..decoding.sampling import SamplingParams
from ..errors import EngineError
from . import prometheus
from .endpoint import Endpoint

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0  # between two chunks: a big prompt's prefill on a busy server can take minutes
QUICK_TIMEOUT_S = 10.0  # /v1/models, /tokenize, /metrics
RATE_EVERY_S = 0.25  # the sparkline's points
CHARS_PER_TOKEN = 4  # the estimate when a server cannot count: labelled as one wherever it is shown


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
        rate = self.accepted / self.drafted if self.drafted else None
        return {"remote": True, "network_included": True, "backend": self.backend, "model": self.model,
                "method": self.server_method or "remote", "prompt_tokens": self.prompt_tokens,
                "generated": self.generated, "ttft_s": self.ttft_s, "decode_s": self.decode_s,
                "tokens_per_s": self.tokens_per_s, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance, "acceptance_source": self.acceptance_source,
                "memory_label": "n/a (remote)", "memory_bytes": None, "memory_kind": None,
                "finish_reason": self.finish_reason, "rate_history": list(self.rate_history)}


class RemoteEngine:
    """One server. Thread-safe enough for one answer at a time plus quick calls (httpx.Client is)."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        self.http = httpx.Client(base_url=endpoint.url, headers=headers, follow_redirects=False,
                                 timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        self._has_spec_metrics: bool | None = None  # unknown until /metrics is read once

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "RemoteEngine":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # --- quick calls --------------------------------------------------------------------------------
    def models(self) -> list[RemoteModel]:
        body = self._get_json("/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise EngineError(f"{self.endpoint.url}/v1/models did not list models: is it an OpenAI-compatible server?")
        out = []
        for item in data:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                meta = item.get("meta") if isinstance(item.get("meta"), dict) else {}
                n_ctx = item.get("max_model_len") or meta.get("n_ctx")  # vLLM's, llama-server's and SpecChat's
                out.append(RemoteModel(item["id"], n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None, meta))
        if not out:
            raise EngineError(f"{self.endpoint.url} serves no models.")
        return out

    def model(self) -> RemoteModel:
        """The endpoint's model (the first the server lists, when none is named)."""
        models = self.models()
        if not self.endpoint.model:
            return models[0]
        for m in models:
            if m.id == self.endpoint.model:
                return m
        raise EngineError(f"{self.endpoint.url} does not serve “{self.endpoint.model}”; it serves "
                          f"{', '.join(m.id for m in models)}.")

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
        """vLLM's spec-decode counters now, or None where the server has none (then it is not asked again)."""
        if self._has_spec_metrics is False:
            return None
        try:
            response = self.http.get("/metrics", timeout=QUICK_TIMEOUT_S)
            counters = prometheus.SpecCounters.from_text(response.text) if response.status_code == 200 else None
        except httpx.HTTPError:
            counters = None
        self._has_spec_metrics = counters is not None and counters.speculates
        return counters if self._has_spec_metrics else None

    def _get_json(self, path: str):
        return self._json(lambda: self.http.get(path, timeout=QUICK_TIMEOUT_S), path)

    def _post_json(self, path: str, body: dict, quiet: bool = False):
        """The JSON answer; with quiet, None for any failure (an endpoint this server lacks)."""
        try:
            return self._json(lambda: self.http.post(path, json=body, timeout=QUICK_TIMEOUT_S), path)
        except EngineError:
            if quiet:
                return None
            raise

    def _json(self, call, path: str):
        try:
            response = call()
        except httpx.HTTPError as exc:
            raise reach_error(self.endpoint.url, exc) from exc
        if response.status_code != 200:
            raise EngineError(status_error(self.endpoint.url + path, response.status_code, response.text))
        try:
            return response.json()
        except ValueError:
            raise EngineError(f"{self.endpoint.url}{path} did not answer JSON.") from None

    # --- answers --------------------------------------------------------------------------------
    def answer(self, messages: list[dict], sampling: SamplingParams, max_tokens: int, model: RemoteModel,
               cancel: threading.Event | None = None, continue_last: bool = False) -> "RemoteAnswer":
        body = {"model": model.id, "messages": messages, "max_tokens": max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "min_p": sampling.min_p,
                "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if continue_last:  # vLLM's names; llama-server continues a last assistant message by itself
            body.update(continue_final_message=True, add_generation_prompt=False)
        backend = f"remote {self.endpoint.host}" + (f" · {model.meta['backend']}" if model.meta.get("backend") else "")
        return RemoteAnswer(self, body, RemoteFigures(backend=backend, model=model.id), cancel or threading.Event())


class RemoteAnswer:
    """Iterate for the answer's text pieces; `figures` fill in as they come. A reasoning model's thought
    (vLLM's and llama-server's reasoning_content) comes as <think>…</think>, as local models write it."""

    def __init__(self, engine: RemoteEngine, body: dict, figures: RemoteFigures, cancel: threading.Event):
        self.engine, self.body, self.figures, self.cancel = engine, body, figures, cancel
        self._thinking = False
        self._timings: dict | None = None
        self._spec_metrics: dict | None = None

    def __iter__(self):
        engine, f = self.engine, self.figures
        before = engine.spec_counters()
        sent = time.perf_counter()
        first = last_point = None
        try:
            with engine.http.stream("POST", "/v1/chat/completions", json=self.body) as response:
                if response.status_code != 200:
                    raise EngineError(status_error(engine.endpoint.url + "/v1/chat/completions",
                                                   response.status_code, response.read().decode("utf-8", "replace")))
                for line in response.iter_lines():
                    if self.cancel.is_set():
                        f.finish_reason = "cancelled"
                        break
                    chunk = _event(line)
                    if chunk is None:
                        continue
                    if chunk == "[DONE]":
                        break
                    text = self._read(chunk)
                    if text:
                        now = time.perf_counter()
                        first = first or now
                        f.ttft_s = first - sent
                        f.decode_s = now - first
                        if not isinstance((chunk.get("usage") or {}).get("completion_tokens"), int):
                            f.generated += 1  # a server without running usage: one chunk, one token (llama-server)
                        if last_point is None or now - last_point >= RATE_EVERY_S:
                            last_point = now
                            if f.tokens_per_s is not None:
                                f.rate_history.append((now - first, f.tokens_per_s))
                        yield text
        except httpx.HTTPError as exc:
            if not self.cancel.is_set():
                raise reach_error(engine.endpoint.url, exc) from exc
            f.finish_reason = "cancelled"
        if self._thinking:
            yield "</think>"
        if f.finish_reason is None and self.cancel.is_set():
            f.finish_reason = "cancelled"
        if f.finish_reason is None:  # no finish reason and no [DONE]: the connection ended mid-answer
            raise EngineError(f"{engine.endpoint.url} ended the answer without finishing it (the connection closed); "
                              "the text so far is kept.")
        self._acceptance(before)

    def _read(self, chunk: dict) -> str:
        """The text in one chunk; usage, timings and the finish reason noted."""
        f = self.figures
        if isinstance(chunk.get("error"), (dict, str)):
            error = chunk["error"]
            said = error.get("message") if isinstance(error, dict) else error
            raise EngineError(f"The server stopped the answer: {said}")
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
        if not choices or not isinstance(choices[0], dict):
            return ""
        choice = choices[0]
        if choice.get("finish_reason"):
            f.finish_reason = "length" if choice["finish_reason"] == "length" else "stop"
        delta = choice.get("delta") or {}
        thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
        content = delta.get("content") or ""
        text = ""
        if thought:
            text += ("" if self._thinking else "<think>") + thought
            self._thinking = True
        if content:
            text += ("</think>" if self._thinking else "") + content
            self._thinking = False
        return text

    def _acceptance(self, before: prometheus.SpecCounters | None) -> None:
        f, t, m = self.figures, self._timings, self._spec_metrics
        if t is not None:
            f.server_method = t.get("method") if isinstance(t.get("method"), str) else None
            if isinstance(t.get("draft_n"), int):
                f.drafted, f.accepted = t["draft_n"], t.get("draft_n_accepted") or 0
                f.mean_acceptance_length = t.get("mean_acceptance_length")
                f.acceptance_source = "from the server's timings for this answer"
            if isinstance(t.get("predicted_n"), int) and not f.generated:
                f.generated = t["predicted_n"]
            if f.drafted is not None:
                return
        if m is not None:
            f.drafted, f.accepted = m.get("num_draft_tokens"), m.get("num_accepted_draft_tokens")
            f.mean_acceptance_length = m.get("mean_acceptance_length")
            f.acceptance_source = "from the server's per-request metrics (vLLM) for this answer"
            return
        if before is not None:
            after = self.engine.spec_counters()
            moved = prometheus.delta(before, after) if after is not None else None
            if moved is not None:
                f.drafted, f.accepted = moved.drafted, moved.accepted
                f.mean_acceptance_length = moved.mean_acceptance_length
                f.per_position_acceptance = moved.per_position_acceptance
                f.acceptance_source = moved.note()


def _event(line: str):
    """The JSON of one server-sent event line, "[DONE]", or None for anything else (comments, pings)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return data
    try:
        chunk = json.loads(data)
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


def reach_error(url: str, exc: httpx.HTTPError) -> EngineError:
    if isinstance(exc, httpx.ConnectError) and "CERTIFICATE" in str(exc).upper():
        return EngineError(f"{url}'s certificate could not be verified ({exc}): SpecChat only talks to https "
                           "servers whose certificate checks out.")
    if isinstance(exc, httpx.ConnectError):
        return EngineError(f"Could not reach {url} ({exc}). Is the server running, and the address right?")
    if isinstance(exc, httpx.TimeoutException):
        return EngineError(f"{url} did not answer in time ({type(exc).__name__}).")
    return EngineError(f"The connection to {url} failed: {type(exc).__name__}: {exc}")


def status_error(url: str, status: int, text: str) -> str:
    """A person's message for an HTTP error, with the server's own words where it gave some."""
    said = text.strip()
    try:
        body = json.loads(said)
        error = body.get("error", body) if isinstance(body, dict) else body
        said = error.get("message") or error.get("detail") or said if isinstance(error, dict) else str(error)
    except ValueError:
        pass
    said = " ".join(str(said).split())[:300]
    if status == 401 or status == 403:
        return f"{url} refused the API key (HTTP {status}). Set the right key in the chat's settings. {said}".strip()
    return f"{url} answered HTTP {status}" + (f": {said}" if said else ".")
