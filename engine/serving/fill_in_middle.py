"""Fill-in-the-middle (FIM): the model writes what goes between a prefix and a suffix, as code editors ask. Two ways in:
`suffix` on /v1/completions (OpenAI's legacy field: `prompt` is the text before the insertion point, `suffix` the
text after it) and llama-server's `/infill` (input_prefix, input_suffix, input_extra, prompt), for editor plug-ins
written for llama.cpp (llama.vim, llama.vscode).

Both build llama.cpp's prompt (tools/server/server-common.cpp, format_prompt_infill), prefix-suffix-middle order:

    [BOS] [FIM_REP]myproject\\n ([FIM_SEP]{filename}\\n{text})... [FIM_SEP]filename\\n
    [FIM_PRE]{prefix}{prompt}[FIM_SUF]{suffix}[FIM_MID]

The repo-level lines come only where the vocabulary has FIM_REP / FIM_SEP (Qwen2.5-Coder); without FIM_SEP each
input_extra chunk follows a "--- snippet ---" line instead. The extra context is cut from its start to what the
context leaves beside the FIM part and the answer (llama.cpp keeps its tail too); on /infill a prefix and suffix
too long for the context are cut, the prefix from its start and the suffix from its end, 3:1 as llama.cpp's
ratio; on /v1/completions nothing is cut (a prompt that does not fit is a 400, as any completion).

Two deviations. The repo-level lines are written only when the request sends other files (input_extra): without
them the prompt is the file-level one Qwen2.5-Coder documents (and Ollama sends). Greedy, between `def fib(n):` and
`print(fib(10))`, Qwen2.5-Coder 1.5B Instruct with the lines wrote the body, the suffix again and an explanation
until max_tokens; without them it stopped after the body (the 0.5B ran to max_tokens with them, and without them
stopped after repeating the print line). And llama.cpp puts BOS after the extra context; here it stays first,
where the model saw it in training.

The FIM prompt is a prompt like any other to the engine: speculation stays on, and prompt lookup copies from the
suffix and the extra files as from any prompt text. Text is tokenized as all prompts here are, control-token
names taken as plain text (a client cannot forge a FIM_MID). A model whose vocabulary lacks FIM_PRE, FIM_SUF or
FIM_MID (llama_vocab_fim_*; llama.cpp also finds them by their names, e.g. <|fim_prefix|>, <PRE>) is a 400."""

from __future__ import annotations

import asyncio
import ctypes
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llama_cpp as L
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..chat_format import provably_too_long, utf8_size
from ..decoding.runtime import Model
from .api_schema import DEFAULT_MAX_TOKENS, ApiError, Generation, checked_text, parse_generation, shown, timings

if TYPE_CHECKING:
    from ..decoding.jobs import Job
    from .openai_api import _Feed, _Handlers

NO_FIM = "this model has no fill-in-the-middle tokens"
MAX_EXTRA_CHUNKS = 256  # llama.vim keeps 16 chunks of context, llama.vscode as many
MAX_FILENAME_CHARS = 4096  # PATH_MAX
REPO_NAME, FILE_NAME = "myproject", "filename"  # llama.cpp's placeholders (it takes neither from the request)
SNIPPET = "\n\n--- snippet ---\n\n"  # llama.cpp's chunk separator for vocabularies without FIM_SEP
PREFIX_SHARE = 3 / 4  # of the room, when prefix and suffix do not both fit (llama.cpp's 3:1)
DISCONNECT_POLL_S = 0.25


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM token ids; rep and sep only where it has them."""

    pre: int
    suf: int
    mid: int
    rep: int | None
    sep: int | None


def fim_tokens(model: Model) -> FimTokens | None:
    """The model's FIM tokens, or None when it lacks any of the three the prompt needs."""

    def token(read: Callable[[L.llama_vocab_p], int]) -> int | None:
        value = int(read(model.vocab))
        return None if value == L.LLAMA_TOKEN_NULL else value

    pre, suf, mid = token(L.llama_vocab_fim_pre), token(L.llama_vocab_fim_suf), token(L.llama_vocab_fim_mid)
    if pre is None or suf is None or mid is None:
        return None
    return FimTokens(pre, suf, mid, token(L.llama_vocab_fim_rep), token(L.llama_vocab_fim_sep))


def has_fim(model: Model) -> bool:
    """For the server's description of its model (/v1/models meta.fill_in_middle)."""
    return fim_tokens(model) is not None


@dataclass(frozen=True)
class Extra:
    """One input_extra chunk: another file's text, for context."""

    filename: str
    text: str


@dataclass(frozen=True)
class Infill:
    prefix: str
    suffix: str
    prompt: str = ""  # /infill's: text after the prefix that the answer continues (llama.cpp's placement)
    extra: tuple[Extra, ...] = ()


@dataclass(frozen=True)
class FimPrompt:
    tokens: list[int]
    truncated: bool  # some of the request's text was left out to fit the context


def _no_fim(param: str) -> ApiError:
    return ApiError(
        400,
        f"'{param}': {NO_FIM}, so it cannot fill in the middle. Send the prompt without a suffix, or serve a code "
        "model that has them (Qwen2.5-Coder, CodeLlama, StarCoder, DeepSeek Coder).",
        param=param,
        code="fim_not_supported",
    )


def _string(body: dict[str, Any], name: str, required: bool) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        said = "is required: " if value is None else ""
        raise ApiError(400, f"'{name}': {said}expected a string (it may be empty), got {shown(value)}", param=name)
    return checked_text(value, name)


def parse_suffix(body: dict[str, Any], chat: bool) -> str:
    """A completion request's `suffix`: "" when absent or empty (a plain completion)."""
    suffix = _string(body, "suffix", required=False)
    if suffix and chat:
        raise ApiError(400, "'suffix': only /v1/completions takes a suffix (fill-in-the-middle)", param="suffix")
    return suffix


def parse_infill(body: dict[str, Any], n_ctx: int) -> tuple[Infill, Generation]:
    """An /infill body: its texts (llama.cpp's rules: input_prefix and input_suffix required, prompt and
    input_extra optional) and the usual sampling fields, n_predict taken as llama-server's max_tokens."""
    prefix, suffix = _string(body, "input_prefix", True), _string(body, "input_suffix", True)
    prompt = _string(body, "prompt", False)
    chunks = body.get("input_extra")
    if chunks is None:
        chunks = []
    if not isinstance(chunks, list) or len(chunks) > MAX_EXTRA_CHUNKS:
        raise ApiError(
            400,
            f"'input_extra': expected a list of up to {MAX_EXTRA_CHUNKS} "
            f'{{"filename": string, "text": string}} objects, got {shown(chunks)}',
            param="input_extra",
        )
    extra = []
    for i, chunk in enumerate(chunks):
        name = f"input_extra[{i}]"
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(
                400, f'\'{name}\': expected {{"filename": string, "text": string}}, got {shown(chunk)}', param=name
            )
        filename = chunk.get("filename", "tmp")  # llama.cpp's default
        if not isinstance(filename, str) or len(filename) > MAX_FILENAME_CHARS:
            raise ApiError(
                400,
                f"'{name}.filename': expected a string of at most {MAX_FILENAME_CHARS} characters, got {shown(filename)}",
                param=f"{name}.filename",
            )
        extra.append(Extra(checked_text(filename, f"{name}.filename"), checked_text(chunk["text"], f"{name}.text")))
    n_predict = body.get("n_predict")
    if n_predict is not None and body.get("max_tokens") is None:
        if isinstance(n_predict, bool) or not isinstance(n_predict, int) or not (n_predict == -1 or n_predict >= 1):
            raise ApiError(
                400,
                f"'n_predict': expected -1 (no limit) or a count of 1 or more, got {shown(n_predict)}",
                param="n_predict",
            )
        body = {**body, "max_tokens": None if n_predict == -1 else n_predict}
    return Infill(prefix, suffix, prompt, tuple(extra)), parse_generation(body, n_ctx)


def _refuse_beyond_context(model: Model, n_ctx: int, fields: dict[str, str]) -> None:
    """A 400 before tokenizing when these texts' bytes alone are more than the context can hold."""
    size = utf8_size(fields.values())
    if provably_too_long(model, size, n_ctx - 1):
        param = max(fields, key=lambda name: len(fields[name]))
        raise ApiError(
            400,
            f"This request's {' and '.join(fields)} are {size:,} bytes of text: more than the model's "
            f"{n_ctx}-token context can hold, whatever the tokens.",
            param=param,
            code="context_length_exceeded",
        )


def fim_prompt(
    model: Model, n_ctx: int, infill: Infill, max_tokens: int | None, fit: bool, names: tuple[str, str]
) -> FimPrompt:
    """On a worker thread: the FIM prompt's tokens. fit: cut prefix and suffix to the context (/infill); names:
    the request's fields for the prefix and the suffix, for the messages."""
    fim = fim_tokens(model)
    if fim is None:
        raise _no_fim(names[1])
    fields = {names[0]: infill.prefix, names[1]: infill.suffix} | ({"prompt": infill.prompt} if infill.prompt else {})
    _refuse_beyond_context(model, n_ctx, fields)
    for i, chunk in enumerate(infill.extra):  # cut to fit below, but one chunk beyond any context is a mistake
        _refuse_beyond_context(model, n_ctx, {f"input_extra[{i}].text": chunk.text})

    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_bos=False, special=False) if text else []

    bos = [model.bos] if model.adds_bos else []
    prefix, suffix, prompt = tok(infill.prefix), tok(infill.suffix), tok(infill.prompt)
    reserve = max_tokens if max_tokens is not None else min(DEFAULT_MAX_TOKENS, n_ctx // 4)  # the answer's room
    room = n_ctx - len(bos) - 3 - len(prompt) - reserve  # for prefix, suffix and the extra context
    truncated = False
    if fit and room > 0 and len(prefix) + len(suffix) > room:
        take_suffix = min(len(suffix), max(room - int(room * PREFIX_SHARE), room - len(prefix)))
        take_prefix = min(len(prefix), room - take_suffix)
        prefix, suffix, truncated = prefix[len(prefix) - take_prefix :], suffix[:take_suffix], True
    core = [fim.pre, *prefix, *prompt, fim.suf, *suffix, fim.mid]
    context, cut = _extra_context(fim, infill.extra, tok, room - len(prefix) - len(suffix))
    return FimPrompt([*bos, *context, *core], truncated or cut)


def _extra_context(
    fim: FimTokens, extra: Sequence[Extra], tok: Callable[[str], list[int]], room: int
) -> tuple[list[int], bool]:
    """The repo-level lines and extra chunks, as many of their last tokens as room holds, and whether any chunk's
    text was left out. Tokenized from the end, and only as far as room reaches: a plug-in may send more than fits."""
    if not extra:  # file-level FIM (the module's docstring says why)
        return [], False
    pieces: list[tuple[int | None, str]] = []  # (a control token or None, text after it)
    if fim.rep is not None:
        pieces.append((fim.rep, f"{REPO_NAME}\n"))
    first_chunk = len(pieces)
    for chunk in extra:
        pieces.append((fim.sep, f"{chunk.filename}\n") if fim.sep is not None else (None, SNIPPET))
        pieces.append((None, chunk.text))
    if fim.sep is not None:
        pieces.append((fim.sep, f"{FILE_NAME}\n"))
    taken: list[list[int]] = []
    n = 0
    for control, text in reversed(pieces):
        if n >= room:
            break
        tokens = ([control] if control is not None else []) + tok(text)
        taken.append(tokens)
        n += len(tokens)
    flat = [t for tokens in reversed(taken) for t in tokens]
    kept = flat[max(0, len(flat) - max(0, room)) :]
    kept_from = len(pieces) - len(taken)  # the first piece (partly) kept: a chunk's text is first_chunk + 1 + 2i
    first_text = first_chunk + 1
    lost = bool(extra) and (kept_from > first_text or (kept_from == first_text and len(kept) < len(flat)))
    return kept, lost


def completion_tokens(model: Model, n_ctx: int, prompt: str, suffix: str, max_tokens: int | None) -> list[int]:
    """/v1/completions with a suffix: the FIM prompt of prompt (the prefix) and suffix, nothing of theirs cut."""
    return fim_prompt(model, n_ctx, Infill(prompt, suffix), max_tokens, False, ("prompt", "suffix")).tokens


# --- /infill ------------------------------------------------------------------------------------------
async def infill(api: _Handlers, request: Request) -> Response:
    """llama-server's POST /infill: its request fields and its response shape (the non-OpenAI completion:
    content, stop, tokens_predicted, tokens_evaluated, stop_type, truncated, timings...), streamed as its SSE
    events without a [DONE]. Errors are OpenAI's error body, as every route here gives."""
    endpoint, job = "/infill", None
    try:
        api.authorised(request)
        body = await api.read_body(request)
        parts, gen = parse_infill(body, api.n_ctx)
        names = ("input_prefix", "input_suffix")
        built = await run_in_threadpool(
            api.config.in_flight.call, fim_prompt, api.target, api.n_ctx, parts, gen.max_tokens, True, names
        )
        job = api.make_job("infill", built.tokens, gen, gen.stop)
        feed = api.submit(job)
    except ApiError as exc:
        api.record(request, endpoint, job, exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
    if gen.stream:
        return EventSourceResponse(_stream(api, request, feed, gen, built), ping=10, sep="\n")
    return await _whole(api, request, feed, gen, built)


async def _whole(api: _Handlers, request: Request, feed: _Feed, gen: Generation, built: FimPrompt) -> Response:
    job = feed.job
    parts: list[str] = []

    async def collect() -> None:
        async for delta in feed.deltas():
            parts.append(delta.text)

    waiter = asyncio.ensure_future(collect())
    while not waiter.done():
        await asyncio.wait([waiter], timeout=DISCONNECT_POLL_S)
        if not waiter.done() and await request.is_disconnected():
            api.scheduler.cancel(job)
    error = api.ended_by_server(job)
    if error:
        api.record(request, "/infill", job, 500)
        failed = ApiError(500, error, kind="server_error")
        return JSONResponse(failed.body(), status_code=500)
    api.record(request, "/infill", job)
    return JSONResponse(_final(api, job, "".join(parts), gen, built))


async def _stream(
    api: _Handlers, request: Request, feed: _Feed, gen: Generation, built: FimPrompt
) -> AsyncIterator[str]:
    job = feed.job
    produced, text = 0, []
    try:
        async for delta in feed.deltas():
            produced += len(delta.tokens)
            if delta.text:
                text.append(delta.text)
                yield json.dumps(
                    {
                        "index": 0,
                        "content": delta.text,
                        "tokens": [],
                        "stop": False,
                        "id_slot": job.run.slot if job.run else -1,
                        "tokens_predicted": produced,
                        "tokens_evaluated": len(job.prompt),
                    }
                )
        error = api.ended_by_server(job)
        if error:
            yield json.dumps(ApiError(500, error, kind="server_error").body())
            api.record(request, "/infill", job, 500)
            return
        # As llama-server's last event: the whole record, its content already sent.
        yield json.dumps({**_final(api, job, "".join(text), gen, built), "content": ""})
        api.record(request, "/infill", job)
    finally:
        if job.finish_reason is None:  # the client went away mid-stream: free its slot now
            api.scheduler.cancel(job)
            api.record(request, "/infill", job, 499)


def _final(api: _Handlers, job: Job, content: str, gen: Generation, built: FimPrompt) -> dict[str, Any]:
    """llama-server's final completion record (server-task.cpp, to_json_non_oaicompat)."""
    assert job.run is not None  # asked of a job that ran
    stats = job.run.stats
    stop_type, word = _stop_type(api.target, job, content)
    sampling = gen.sampling
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": job.run.slot,
        "stop": True,
        "model": api.config.model_id,
        "tokens_predicted": stats.generated,
        "tokens_evaluated": stats.prompt_tokens,
        "generation_settings": {
            "n_predict": job.max_tokens,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "seed": sampling.seed,
            "stop": list(gen.stop),
            "ignore_eos": gen.ignore_eos,
            "stream": gen.stream,
        },
        "prompt": _with_control_tokens(api.target, job.prompt),
        "has_new_line": "\n" in content,
        "truncated": built.truncated,
        "stop_type": stop_type,
        "stopping_word": word,
        "tokens_cached": stats.reused_prompt_tokens,
        "timings": timings(stats),
    }


def _stop_type(model: Model, job: Job, content: str) -> tuple[str, str]:
    """llama-server's stop_type ("eos", "word", "limit", "none") and the stop string that ended the answer. A stop
    string's tokens are kept (its text is not shown), so the answer's whole text starts with the content, then it."""
    reason = job.finish_reason
    if reason in ("length", "context"):
        return "limit", ""
    if reason != "stop":
        return "none", ""
    assert job.run is not None  # a job that stopped ran
    written = model.detokenize(job.run.tokens)
    word = next((s for s in job.stop if written.startswith(s, len(content))), None)
    return ("word", word) if word is not None else ("eos", "")


def _with_control_tokens(model: Model, tokens: Sequence[int]) -> str:
    """The prompt as text with its FIM tokens written out, as llama-server's `prompt` field shows it."""
    array = (L.llama_token * len(tokens))(*tokens)
    size = max(64, 4 * len(tokens))
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = L.llama_detokenize(model.vocab, array, len(tokens), buf, size, False, True)
        if n >= 0:
            return buf.raw[:n].decode("utf-8", "replace")
        size = -n
    return ""
