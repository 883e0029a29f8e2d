"""OpenAI's request and response shapes: a request body checked field by field into what the engine
needs, and the engine's figures written back as `usage` and a llama-server-style `timings` object.
Unknown fields are ignored (as llama-server does); known ones of the wrong type or range are a 400."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..decoding.batch import Job
from ..decoding.sampling import SamplingParams
from ..decoding.stats import GenerationStats
from ..errors import InvalidSettingError

MAX_STOPS = 4  # as OpenAI allows
DEFAULT_MAX_TOKENS = 2048  # when a request names none (and the context has room)


class ApiError(Exception):
    """An error the client gets back as OpenAI's {"error": {...}} body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}': {message}", param=param)


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(name, f"expected a number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        raise _bad(name, f"must be {'above' if low_open else 'at least'} {low} and at most {high}, got {value!r}")
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"expected a whole number, got {value!r}")
    if value < low or (high is not None and value > high):
        raise _bad(name, f"must be between {low} and {high}, got {value!r}" if high is not None
                   else f"must be at least {low}, got {value!r}")
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(name, f"expected true or false, got {value!r}")
    return value


@dataclass
class Generation:
    """What a request asks the engine for, before its prompt is tokenized."""

    sampling: SamplingParams
    max_tokens: int | None  # None: as many as the context allows, up to DEFAULT_MAX_TOKENS
    stop: list[str]
    stream: bool
    include_usage: bool
    continuous_usage: bool  # vLLM's stream_options.continuous_usage_stats: usage in every chunk
    ignore_eos: bool  # llama-server's extension: write max_tokens tokens whatever the model says (benchmarks)


def parse_generation(body: dict, n_ctx: int) -> Generation:
    """The sampling, length and streaming fields common to both completion endpoints."""
    for name, allowed in (("n", (None, 1)), ("best_of", (None, 1)), ("logprobs", (None, False)),
                          ("echo", (None, False)), ("suffix", (None, ""))):
        if body.get(name) not in allowed:
            raise _bad(name, f"only {allowed[-1]!r} is supported by this server")
    for name in ("tools", "functions", "logit_bias"):
        if body.get(name):
            raise _bad(name, "is not supported by this server")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0.0:  # a penalty would change the distribution we verify
            raise _bad(name, "only 0 is supported (speculation here is lossless for the plain distribution)")
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise _bad("response_format", "only {\"type\": \"text\"} is supported")
    limit = n_ctx - 1
    max_tokens = _integer(body, "max_completion_tokens", None, 1, limit)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", None, 1, limit)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)) or len(stop) > MAX_STOPS:
        raise _bad("stop", f"expected a string or a list of up to {MAX_STOPS} strings")
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict) and all(
            isinstance(options.get(k, False), bool) for k in ("include_usage", "continuous_usage_stats"))):
        raise _bad("stream_options", "expected {\"include_usage\": true|false, \"continuous_usage_stats\": true|false}")
    defaults = SamplingParams()
    try:
        sampling = SamplingParams(
            temperature=_number(body, "temperature", defaults.temperature, 0.0, 2.0),
            top_p=_number(body, "top_p", defaults.top_p, 0.0, 1.0, low_open=True),
            top_k=_integer(body, "top_k", defaults.top_k, 0),
            min_p=_number(body, "min_p", defaults.min_p, 0.0, 0.999),
            seed=_integer(body, "seed", None, -2**63, 2**63 - 1),
        )
    except InvalidSettingError as exc:  # the ranges above are the same; this is a second net
        raise ApiError(400, str(exc)) from exc
    return Generation(sampling, max_tokens, [s for s in stop if s], _flag(body, "stream"),
                      bool((options or {}).get("include_usage")), bool((options or {}).get("continuous_usage_stats")),
                      _flag(body, "ignore_eos"))


def parse_messages(body: dict, answering: bool = True) -> list[dict]:
    """Chat messages as the formatter takes them: role and text (text parts of a content list joined). Messages
    to answer end with the user's; messages only counted (/tokenize) may end with an answer."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise _bad(f"messages[{i}]", "expected {\"role\": system|developer|user|assistant, \"content\": ...}")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise _bad(f"messages[{i}].content", "only text parts are supported")
            content = "".join(p["text"] for p in content)
        if content is None and m.get("role") == "assistant":
            content = ""
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content", f"expected text, got {content!r}"[:200])
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    if answering and out[-1]["role"] != "user":
        raise _bad("messages", "the last message must be the user's")
    return out


def parse_prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise _bad("prompt", "expected a non-empty string")
    return prompt


def fit_prompt(tokens: list[int], max_tokens: int | None, n_ctx: int) -> int:
    """The answer's token budget for a prompt, or a 400 when the prompt leaves no room for one."""
    room = n_ctx - len(tokens)
    if room < 1:
        raise ApiError(400, f"This request is {len(tokens)} tokens; the model's context holds {n_ctx} "
                            "and needs room for the answer.", param="messages", code="context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        raise ApiError(400, f"max_tokens {max_tokens} does not fit: the prompt is {len(tokens)} tokens and the "
                            f"context holds {n_ctx}; at most {room} remain.", param="max_tokens",
                       code="context_length_exceeded")
    return max_tokens if max_tokens is not None else min(room, DEFAULT_MAX_TOKENS)


# --- what goes back ---------------------------------------------------------------------------------
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}


def finish_reason(job: Job) -> str | None:
    return FINISH_REASONS.get(job.finish_reason or "", None)


def usage(stats: GenerationStats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated,
            "total_tokens": stats.prompt_tokens + stats.generated,
            "prompt_tokens_details": {"cached_tokens": stats.reused_prompt_tokens}}


def timings(stats: GenerationStats) -> dict:
    """llama-server's timings plus the speculation figures: draft_n verified drafts, draft_n_accepted kept ones.
    predicted_per_second is llama.cpp's (tools/server: n_decoded / t_token_generation): every answer token, the
    first included, over the time from the first token to the last. The chat's stats line
    (GenerationStats.decode_tokens_per_s) leaves the first token out, so it reads lower, most on short answers;
    the Server panel shows this figure, labelled as this one."""
    predicted_ms = stats.decode_s * 1000.0
    prompt_n = stats.prompt_tokens - stats.reused_prompt_tokens
    prompt_ms = stats.prefill_s * 1000.0
    return {
        "cache_n": stats.reused_prompt_tokens,
        "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms > 0 else None,
        "predicted_n": stats.generated, "predicted_ms": predicted_ms,
        "predicted_per_second": 1000.0 * stats.generated / predicted_ms if predicted_ms > 0 else None,
        "draft_n": stats.drafted, "draft_n_accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "method": stats.method,
    }
