"""An OpenAI-compatible server elsewhere (vLLM, llama-server, a SpecChat server): its models, the prompt's size by
the server's own tokenizer where it has one, its spec-decode counters, and a streamed chat answer
(answer_stream.RemoteAnswer) with figures measured here.

Speed and time to first token are timed on this machine, so they include the network. Memory is the server's: n/a.

A server is not trusted to behave. Every body is read to a cap (a line of the stream, an error, the model list,
/metrics) and a quick call to a deadline (reading.py); an answer ends at its own caps (answer_stream.py); the stream
is parsed as the SSE spec says (sse.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from .. import text_rules
from ..decoding.sampling import SamplingParams
from ..errors import EngineError
from . import prometheus
from .answer_stream import RemoteAnswer, RemoteFigures
from .endpoint import Endpoint
from .reading import (
    CONNECT_TIMEOUT_S,
    MAX_ERROR_BYTES,
    MAX_SHOWN_CHARS,
    MIB,
    cut,
    reach_error,
    read_capped,
    status_error,
)

log = logging.getLogger(__name__)
READ_TIMEOUT_S = 300.0  # with no new event: a big prompt's prefill on a busy server can take minutes
QUICK_TIMEOUT_S = 10.0  # /v1/models, /tokenize, /metrics, start to end (a byte a second must not keep one open)
CHARS_PER_TOKEN = 4  # the estimate when a server cannot count: labelled as one wherever it is shown
MAX_JSON_BYTES = 8 * MIB  # /v1/models, /tokenize: hundreds of models with their descriptions take a few MiB
MAX_METRICS_BYTES = 8 * MIB  # vLLM's /metrics is a few hundred kB; past this the counters are not used
MAX_MODELS = 1000  # listed (a model named is looked for among all)
MAX_MODEL_ID_CHARS = 512  # a longer id is no model's name: not listed


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
            f"{self.endpoint.url} does not serve “{cut(self.endpoint.model, 100)}”; it serves "
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
        served_by = f" · {cut(str(model.meta['backend']), 64)}" if model.meta.get("backend") else ""
        backend = f"remote {self.endpoint.host}{served_by}"
        return RemoteAnswer(self, body, RemoteFigures(backend=backend, model=model.id), cancel or threading.Event())


def _listed_model(item) -> RemoteModel | None:
    if not (isinstance(item, dict) and isinstance(item.get("id"), str) and 0 < len(item["id"]) <= MAX_MODEL_ID_CHARS):
        return None
    raw_meta = item.get("meta")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    n_ctx = item.get("max_model_len") or meta.get("n_ctx")  # vLLM's, llama-server's and SpecChat's
    return RemoteModel(item["id"], n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None, meta)


def _some(names: list[str]) -> str:
    """names, as many as fit in about MAX_SHOWN_CHARS, and how many more there are."""
    shown: list[str] = []
    size = 0
    for name in names:
        if shown and size + len(name) > MAX_SHOWN_CHARS:
            break
        shown.append(cut(name, MAX_SHOWN_CHARS))
        size += len(name) + 2
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" and {rest:,} more" if rest else "")
