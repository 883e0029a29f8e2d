"""OpenAI's request and response shapes: a request body checked field by field into what the engine
needs, and the engine's figures written back as `usage` and a llama-server-style `timings` object.
Unknown fields are ignored (as llama-server does); known ones of the wrong type or range are a 400.

Every field a client can size is bounded (issue 63: one 1 MB stop string stalled every request for 54 s): the
stop strings by the constants below, messages by MAX_MESSAGES and their text by the context (openai_api refuses
text whose byte length alone cannot fit), max_tokens by the context, n/best_of to 1, tools and logit_bias refused
whole, and everything by the body's size limit. Text that is not valid Unicode (a lone surrogate such as
"\\ud800", which JSON can spell but UTF-8 cannot encode) is a 400 naming its field: the tokenizer could not
take it."""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass
from typing import Any, overload

from ..decoding.jobs import Job
from ..decoding.sampling import SamplingParams
from ..decoding.stats import GenerationStats
from ..errors import InvalidSettingError
from ..figures import mean_accepted_length

MAX_STOPS = 16  # OpenAI allows 4; llama-server and vLLM any number, and their clients may send more than 4
MAX_STOP_CHARS = 1024  # per stop string: far beyond any template's or person's, short to match every token
MAX_MESSAGES = 2048  # as OpenAI allows
MAX_CONTENT_PARTS = 1024  # text parts of one message's content list
MAX_TOP_K = 2**31 - 1  # llama.cpp's int32
DEFAULT_MAX_TOKENS = 2048  # when a request names none (and the context has room)


class ApiError(Exception):
    """An error the client gets back as OpenAI's {"error": {...}} body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        # A lone surrogate quoted from a request could not be written as UTF-8: escaped, the error still goes out.
        message = self.message.encode("utf-8", "backslashreplace").decode("utf-8")
        return {"error": {"message": message, "type": self.kind, "param": self.param, "code": self.code}}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}': {message}", param=param)


_REPR = reprlib.Repr()  # a client's value, quoted back in a message: short however big or deep it is
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel = 3


def shown(value: object) -> str:
    return _REPR.repr(value)


def checked_text(text: str, param: str, name: str | None = None) -> str:
    """text, or a 400 for param when it holds a lone surrogate (JSON's "\\ud800"): not valid Unicode, so
    neither the tokenizer nor a response could encode it. name: the part of param the message names."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _bad(
            param,
            f"{name or param} has a lone surrogate ({text[exc.start]!r}) at character {exc.start}, "
            "which is not valid Unicode; send UTF-8 text",
        ) from None
    return text


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not math.isfinite(value))
    ):  # (isfinite overflows on a 400-digit int)
        raise _bad(name, f"expected a number, got {shown(value)}")
    if value > high or value < low or (low_open and value == low):
        raise _bad(name, f"must be {'above' if low_open else 'at least'} {low} and at most {high}, got {shown(value)}")
    return float(value)


@overload
def _integer(body: dict[str, Any], name: str, default: int, low: int, high: int | None = None) -> int: ...
@overload
def _integer(body: dict[str, Any], name: str, default: None, low: int, high: int | None = None) -> int | None: ...
def _integer(body: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"expected a whole number, got {shown(value)}")
    if value < low or (high is not None and value > high):
        raise _bad(
            name,
            f"must be between {low} and {high}, got {shown(value)}"
            if high is not None
            else f"must be at least {low}, got {shown(value)}",
        )
    return value


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(name, f"expected true or false, got {shown(value)}")
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


def parse_generation(body: dict[str, Any], n_ctx: int) -> Generation:
    """The sampling, length and streaming fields common to both completion endpoints."""
    for name, allowed in (
        ("n", (None, 1)),
        ("best_of", (None, 1)),
        ("logprobs", (None, False)),
        ("echo", (None, False)),
    ):
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
        raise _bad("response_format", 'only {"type": "text"} is supported')
    limit = n_ctx - 1
    max_tokens = _integer(body, "max_completion_tokens", None, 1, limit)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", None, 1, limit)
    stop = parse_stop(body)
    options = body.get("stream_options")
    if options is not None and not (
        isinstance(options, dict)
        and all(isinstance(options.get(k, False), bool) for k in ("include_usage", "continuous_usage_stats"))
    ):
        raise _bad("stream_options", 'expected {"include_usage": true|false, "continuous_usage_stats": true|false}')
    defaults = SamplingParams()
    try:
        sampling = SamplingParams(
            temperature=_number(body, "temperature", defaults.temperature, 0.0, 2.0),
            top_p=_number(body, "top_p", defaults.top_p, 0.0, 1.0, low_open=True),
            top_k=_integer(body, "top_k", defaults.top_k, 0, MAX_TOP_K),
            min_p=_number(body, "min_p", defaults.min_p, 0.0, 0.999),
            seed=_integer(body, "seed", None, -(2**63), 2**63 - 1),
        )
    except InvalidSettingError as exc:  # the ranges above are the same; this is a second net
        raise ApiError(400, str(exc)) from exc
    return Generation(
        sampling,
        max_tokens,
        stop,
        _flag(body, "stream"),
        bool((options or {}).get("include_usage")),
        bool((options or {}).get("continuous_usage_stats")),
        _flag(body, "ignore_eos"),
    )


def parse_stop(body: dict[str, Any]) -> list[str]:
    """The stop strings, empty ones dropped: at most MAX_STOPS, each at most MAX_STOP_CHARS (the matcher runs
    on the engine thread every request shares)."""
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS:
        raise _bad("stop", f"expected a string or a list of up to {MAX_STOPS} strings, got {shown(stop)}")
    for i, s in enumerate(stops):
        name = "stop" if isinstance(stop, str) else f"stop[{i}]"
        if not isinstance(s, str):
            raise _bad("stop", f"{name} is {shown(s)}; expected a string")
        if len(s) > MAX_STOP_CHARS:
            raise _bad("stop", f"{name} is {len(s):,} characters; at most {MAX_STOP_CHARS:,}")
        checked_text(s, "stop", name)
    return [s for s in stops if s]


def parse_messages(body: dict[str, Any], answering: bool = True) -> list[dict[str, str]]:
    """Chat messages as the formatter takes them: role and text (text parts of a content list joined). Messages
    to answer end with the user's; messages only counted (/tokenize) may end with an answer."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "expected a non-empty list of messages")
    if len(messages) > MAX_MESSAGES:
        raise _bad("messages", f"{len(messages):,} messages; at most {MAX_MESSAGES:,}")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if not isinstance(role, str) or role not in ("system", "developer", "user", "assistant"):
            raise _bad(f"messages[{i}]", 'expected {"role": system|developer|user|assistant, "content": ...}')
        content = _content(m.get("content"), f"messages[{i}].content")
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content", f"expected text, got {shown(content)}")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    if answering and out[-1]["role"] != "user":
        raise _bad("messages", "the last message must be the user's")
    return out


def _content(content: object, param: str) -> object:
    """A message's content: its text parts joined, checked as text; anything else as it came."""
    if isinstance(content, list):  # content parts: text only
        if len(content) > MAX_CONTENT_PARTS:
            raise _bad(param, f"{len(content):,} parts; at most {MAX_CONTENT_PARTS:,}")
        for j, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise _bad(param, f"{param}[{j}]: only text parts are supported, got {shown(p)}")
            checked_text(p["text"], f"{param}[{j}].text")
        return "".join(p["text"] for p in content)
    return checked_text(content, param) if isinstance(content, str) else content


def parse_prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise _bad("prompt", f"expected a non-empty string, got {shown(prompt)}")
    return checked_text(prompt, "prompt")


def fit_prompt(tokens: list[int], max_tokens: int | None, n_ctx: int) -> int:
    """The answer's token budget for a prompt, or a 400 when the prompt leaves no room for one."""
    room = n_ctx - len(tokens)
    if room < 1:
        raise ApiError(
            400,
            f"This request is {len(tokens)} tokens; the model's context holds {n_ctx} and needs room for the answer.",
            param="messages",
            code="context_length_exceeded",
        )
    if max_tokens is not None and max_tokens > room:
        raise ApiError(
            400,
            f"max_tokens {max_tokens} does not fit: the prompt is {len(tokens)} tokens and the "
            f"context holds {n_ctx}; at most {room} remain.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return max_tokens if max_tokens is not None else min(room, DEFAULT_MAX_TOKENS)


# --- what goes back ---------------------------------------------------------------------------------
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}


def finish_reason(job: Job) -> str | None:
    return FINISH_REASONS.get(job.finish_reason or "")


def usage(stats: GenerationStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated,
        "total_tokens": stats.prompt_tokens + stats.generated,
        "prompt_tokens_details": {"cached_tokens": stats.reused_prompt_tokens},
    }


def timings(stats: GenerationStats) -> dict[str, Any]:
    """llama-server's timings plus the speculation figures: draft_n verified drafts, draft_n_accepted kept ones, and
    by_proposer, per proposer as Proposal.source names it ("lookup", "draft", "mtp": the model's built-in drafter,
    "eagle3": a draft head), the same two, the target steps that verified its drafts and their mean accepted length.
    predicted_per_second is llama.cpp's (tools/server: n_decoded / t_token_generation): every answer token, the
    first included, over the time from the first token to the last. The chat's stats line
    (GenerationStats.decode_tokens_per_s) leaves the first token out, so it reads lower, most on short answers;
    the Server panel shows this figure, labelled as this one."""
    predicted_ms = stats.decode_s * 1000.0
    prompt_n = stats.prompt_tokens - stats.reused_prompt_tokens
    prompt_ms = stats.prefill_s * 1000.0
    return {
        "cache_n": stats.reused_prompt_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms > 0 else None,
        "predicted_n": stats.generated,
        "predicted_ms": predicted_ms,
        "predicted_per_second": 1000.0 * stats.generated / predicted_ms if predicted_ms > 0 else None,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "method": stats.method,
        "by_proposer": {
            source: {
                **counts,
                "mean_acceptance_length": mean_accepted_length(counts["accepted"], counts.get("steps", 0)),
            }
            for source, counts in stats.by_proposer.items()
        },
    }
