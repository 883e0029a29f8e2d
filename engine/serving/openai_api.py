"""The OpenAI-compatible HTTP API (Starlette; SSE by sse-starlette) over the engine thread (scheduler.py).

Each request becomes a Job; the engine thread hands its deltas to this event loop through a queue.
A client that goes away cancels its job, so its slot is free at the next step.

The event loop never does model work: parsing a body, templating and tokenizing run on worker threads, so
/health and every other request answer while a big one is prepared. A body over ApiConfig.max_body_bytes is
refused (413) from its Content-Length, or as soon as that many bytes have come; a body still arriving after
BODY_TIMEOUT_S is a 408; a prompt whose byte length alone is more than the context can hold is a 400 before it
is templated or tokenized; a body that is not a JSON object, or whose fields are not what api_schema.py takes,
is a 4xx naming what is wrong (request_body.py), never a 500; a chat template the sandbox refused
(engine/template_sandbox.py) makes chat requests fail with a clear 500 rather than guess another format for a
client that cannot see a notice.
Requests a web page could have sent are refused before any route runs (request_guard.py).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any, cast

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..chat_format import ChatFormatter, provably_too_long, utf8_size
from ..decoding.answer import Delta
from ..decoding.jobs import Job, job_for
from ..errors import EngineError
from . import fill_in_middle as fim
from .api_config import ApiConfig, RequestRecord, keep_record
from .api_schema import (
    ApiError,
    Generation,
    checked_text,
    finish_reason,
    fit_prompt,
    parse_generation,
    parse_messages,
    parse_prompt,
    timings,
    usage,
)
from .prediction import completion_tokens_details, parse_prediction, prediction_tokens
from .request_body import declared_length, parse_json, read_capped, too_large
from .request_guard import RequestGuard
from .scheduler import SERVER_STOPPED, QueueFull, Scheduler, ServerStopping

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1
DISCONNECT_POLL_S = 0.25
BODY_TIMEOUT_S = 30.0  # for the whole body to arrive once the headers have


class _Feed:
    """A job's deltas, from the engine thread to this event loop."""

    def __init__(self, job: Job):
        self.job = job
        self.queue: asyncio.Queue[Delta | None] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        job.on_delta = lambda _job, delta: self._hand_over(delta)
        job.on_done = lambda _job: self._hand_over(None)

    def _hand_over(self, item: Delta | None) -> None:
        """On the engine thread. A loop already closed has no client left to tell: that is no error of the
        engine's (raised there, it failed the step of every other job and logged 'Event loop is closed')."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass

    async def deltas(self) -> AsyncIterator[Delta]:
        while (delta := await self.queue.get()) is not None:
            yield delta


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def create_app(scheduler: Scheduler, formatter: ChatFormatter, config: ApiConfig) -> Starlette:
    api = _Handlers(scheduler, formatter, config)
    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/infill", api.infill, methods=["POST"]),  # llama-server's, for editor plug-ins
        Route("/health", api.health, methods=["GET"]),
    ]
    middleware = [Middleware(RequestGuard, config=config)]  # first: outside CORS, so a refused Origin gets no CORS
    if config.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.cors_origins),
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=["authorization", "content-type"],
            )
        )
    return Starlette(
        routes=routes, middleware=middleware, exception_handlers={HTTPException: api.http_error, Exception: api.crashed}
    )


class _Handlers:
    """The routes' handlers over one scheduler and its model: create_app wires them to their paths."""

    def __init__(self, scheduler: Scheduler, formatter: ChatFormatter, config: ApiConfig):
        self.scheduler, self.formatter, self.config = scheduler, formatter, config
        self.target = scheduler.target
        self.n_ctx = self.target.n_ctx

    def authorised(self, request: Request) -> None:
        if not self.config.api_key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        # As bytes: compare_digest raises TypeError for a str with non-ASCII characters (a 500, before).
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode("latin-1"), self.config.api_key.encode("utf-8")
        ):
            raise ApiError(
                401,
                "Invalid or missing API key (send 'Authorization: Bearer <key>').",
                kind="authentication_error",
                code="invalid_api_key",
            )

    async def read_body(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object, or a 4xx ApiError (request_body.py): never an exception that becomes a 500."""
        cap = self.config.max_body_bytes
        declared = declared_length(request.headers.get("content-length"))
        if declared is not None and declared > cap:
            raise too_large(declared, cap)
        try:
            raw = await asyncio.wait_for(read_capped(request, cap), BODY_TIMEOUT_S)
        except TimeoutError:
            raise ApiError(
                408,
                f"The request body did not arrive within {BODY_TIMEOUT_S:g} s.",
                code="request_timeout",
                headers={"Connection": "close"},
            ) from None
        if raw is None:
            raise too_large(None, cap)
        return await run_in_threadpool(parse_json, raw)  # a few MB of JSON is tens of ms: not on the event loop

    def chat_tokens(
        self, messages: list[dict[str, str]], limit: bool = True, continue_last: bool = False
    ) -> tuple[list[int], tuple[str, ...]]:
        """On a worker thread: the size check (unless only counting), then the template (in its sandbox) and
        the tokenizer; continue_last: the last message is an answer to write more of."""
        if limit:
            self.refuse_beyond_context(m["content"] for m in messages)
        refused = self.template_refusal()
        if refused is None:
            try:
                _, tokens, stops = self.formatter.render(messages, continue_last)
            except EngineError as exc:
                raise ApiError(400, str(exc), param="messages") from exc
            refused = self.template_refusal()  # refused by this very render
        if refused is not None:
            raise refused
        return tokens, stops

    def prompt_tokens(self, prompt: str) -> list[int]:
        self.refuse_beyond_context([prompt])
        return self.target.tokenize(prompt, add_bos=self.target.adds_bos, special=False)

    def refuse_beyond_context(self, texts: Iterable[str]) -> None:
        size = utf8_size(texts)
        if provably_too_long(self.target, size, self.n_ctx - 1):
            raise ApiError(
                400,
                f"This request is {size:,} bytes of text: more than the model's {self.n_ctx}-token "
                "context can hold, whatever the tokens.",
                param="messages",
                code="context_length_exceeded",
            )

    def template_refusal(self) -> ApiError | None:
        if not (self.formatter.template and self.formatter.refusal):
            return None
        return ApiError(
            500,
            f"{self.formatter.refusal} This server does not guess "
            "another chat format: send a formatted prompt to /v1/completions, or serve a model "
            "whose template works.",
            kind="server_error",
            code="chat_template_refused",
        )

    def make_job(
        self, kind: str, tokens: list[int], gen: Generation, stop: list[str], prediction: list[int] | None = None
    ) -> Job:
        budget = fit_prompt(tokens, gen.max_tokens, self.n_ctx)
        return job_for(
            f"{kind}-{uuid.uuid4().hex[:24]}",
            tokens,
            gen.sampling,
            budget,
            gen.ignore_eos,
            stop=stop,
            prediction=prediction or (),
        )

    def submit(self, job: Job) -> _Feed:
        feed = _Feed(job)
        try:
            self.scheduler.submit(job)
        except ServerStopping as exc:
            raise ApiError(503, "The server is stopping.", kind="server_error", code="server_stopping") from exc
        except QueueFull as exc:
            raise ApiError(
                429,
                f"The server is busy: {exc}. Retry shortly.",
                kind="rate_limit_error",
                code="server_busy",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from exc
        except EngineError as exc:
            raise ApiError(400, str(exc)) from exc
        return feed

    def record(self, request: Request, endpoint: str, job: Job | None, status: int = 200) -> None:
        rec = RequestRecord(
            job.id if job else "-", endpoint, request.client.host if request.client else "?", time.time(), status=status
        )
        if job is not None and job.run is not None:
            stats = job.run.stats
            rec.prompt_tokens, rec.completion_tokens = stats.prompt_tokens, stats.generated
            # The figure the API's timings give for this request: one definition (api_schema.timings), not the
            # chat's, which leaves the first token out and so read 1.8 where the response said 3.68.
            rec.tokens_per_s, rec.acceptance_rate = timings(stats)["predicted_per_second"], stats.acceptance_rate
            rec.ttft_s, rec.method, rec.finish = stats.ttft_s, stats.method, job.finish_reason
        if status == 499:  # the client went away: its job ends at the engine's next step
            rec.finish = "cancelled"
        keep_record(self.config, rec)

    def envelope(self, job: Job, kind: str) -> dict[str, Any]:
        return {
            "id": job.id,
            "object": kind,
            "created": int(time.time()),
            "model": self.config.model_id,
            "system_fingerprint": f"specchat-{self.scheduler.method}",
        }

    def ended_by_server(self, job: Job) -> str | None:
        """Why the engine ended this job short, for its client, or None. Only a client that goes away cancels its
        job, so one cancelled while its client waits was ended by the server stopping (Scheduler._end_jobs)."""
        if job.error:
            return job.error
        if job.finish_reason == "cancelled" and self.scheduler.stopping:
            return SERVER_STOPPED
        return None

    def figures(self, job: Job) -> dict[str, Any]:
        assert job.run is not None  # asked of a job that ran
        counted, details = usage(job.run.stats), completion_tokens_details(job, job.run.stats)
        if details is not None:
            counted["completion_tokens_details"] = details
        return {"usage": counted, "timings": timings(job.run.stats)}

    async def complete(self, request: Request, endpoint: str, chat: bool) -> Response:
        job = None
        try:
            self.authorised(request)
            body = await self.read_body(request)
            gen = parse_generation(body, self.n_ctx)
            suffix = fim.parse_suffix(body, chat)
            predicted = parse_prediction(body)
            if chat:
                continuing = body.get("continue_final_message") is True  # vLLM's name: write more of the last answer
                messages = parse_messages(body, answering=not continuing)
                if continuing and messages[-1]["role"] != "assistant":
                    raise ApiError(400, "continue_final_message needs the assistant's answer last.", param="messages")
                tokens, template_stops = await run_in_threadpool(
                    self.config.in_flight.call, self.chat_tokens, messages, True, continuing
                )
                stop = [*gen.stop, *template_stops]
            elif suffix:  # fill in the middle between prompt and suffix
                tokens = await run_in_threadpool(
                    self.config.in_flight.call,
                    fim.completion_tokens,
                    self.target,
                    self.n_ctx,
                    parse_prompt(body),
                    suffix,
                    gen.max_tokens,
                )
                stop = gen.stop
            else:
                tokens = await run_in_threadpool(self.config.in_flight.call, self.prompt_tokens, parse_prompt(body))
                stop = gen.stop
            prediction = None
            if predicted is not None:
                prediction = await run_in_threadpool(
                    self.config.in_flight.call, prediction_tokens, self.target, predicted, self.n_ctx
                )
            job = self.make_job("chatcmpl" if chat else "cmpl", tokens, gen, stop, prediction)
            feed = self.submit(job)
        except ApiError as exc:
            self.record(request, endpoint, job, exc.status)
            return _error_response(exc)
        if gen.stream:
            return EventSourceResponse(self.stream(request, endpoint, feed, chat, gen), ping=10, sep="\n")
        return await self.whole(request, endpoint, feed, chat)

    async def whole(self, request: Request, endpoint: str, feed: _Feed, chat: bool) -> JSONResponse:
        """A non-streamed answer; a client that hangs up first cancels it."""
        job = feed.job
        parts: list[str] = []
        waiter = asyncio.ensure_future(_collect(feed, parts))
        while not waiter.done():
            await asyncio.wait([waiter], timeout=DISCONNECT_POLL_S)
            if not waiter.done() and await request.is_disconnected():
                self.scheduler.cancel(job)
        text = "".join(parts)
        error = self.ended_by_server(job)
        if error:
            self.record(request, endpoint, job, 500)
            return _error_response(ApiError(500, error, kind="server_error"))
        self.record(request, endpoint, job)
        reason = finish_reason(job)
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": reason,
                "logprobs": None,
            }
        else:
            choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
        kind = "chat.completion" if chat else "text_completion"
        return JSONResponse({**self.envelope(job, kind), "choices": [choice], **self.figures(job)})

    async def stream(
        self, request: Request, endpoint: str, feed: _Feed, chat: bool, gen: Generation
    ) -> AsyncIterator[str]:
        job = feed.job
        kind = "chat.completion.chunk" if chat else "text_completion"

        produced = 0  # tokens streamed so far, counted from the deltas (the engine may be a step ahead)

        def chunk(content: str | None, reason: str | None = None, role: bool = False) -> dict[str, Any]:
            if chat:
                delta = ({"role": "assistant"} if role else {}) | ({"content": content} if content is not None else {})
                choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
            else:
                choice = {"index": 0, "text": content or "", "finish_reason": reason, "logprobs": None}
            out = {**self.envelope(job, kind), "choices": [choice]}
            if gen.continuous_usage:
                prompt_n = len(job.prompt)
                out["usage"] = {
                    "prompt_tokens": prompt_n,
                    "completion_tokens": produced,
                    "total_tokens": prompt_n + produced,
                }
            return out

        try:
            if chat:
                yield json.dumps(chunk("", role=True))
            async for delta in feed.deltas():
                produced += len(delta.tokens)
                if delta.text:
                    yield json.dumps(chunk(delta.text))
            error = self.ended_by_server(job)
            if error:
                yield json.dumps(ApiError(500, error, kind="server_error").body())
                self.record(request, endpoint, job, 500)
                return
            yield json.dumps({**chunk(None, finish_reason(job)), **self.figures(job)})
            if gen.include_usage:
                yield json.dumps({**self.envelope(job, kind), "choices": [], **self.figures(job)})
            yield "[DONE]"
            self.record(request, endpoint, job)
        finally:
            if job.finish_reason is None:  # the client went away mid-stream: free its slot now
                self.scheduler.cancel(job)
                self.record(request, endpoint, job, 499)

    async def chat_completions(self, request: Request) -> Response:
        return await self.complete(request, "/v1/chat/completions", chat=True)

    async def completions(self, request: Request) -> Response:
        return await self.complete(request, "/v1/completions", chat=False)

    async def infill(self, request: Request) -> Response:
        return await fim.infill(self, request)

    async def models(self, request: Request) -> Response:
        try:
            self.authorised(request)
        except ApiError as exc:
            return _error_response(exc)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.model_id,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "specchat",
                        "meta": {
                            "n_ctx": self.n_ctx,
                            "method": self.scheduler.method,
                            "parallel": self.scheduler.parallel,
                            "backend": self.target.backend,
                            "chat_template_error": self.formatter.template_error,
                            "fill_in_middle": fim.has_fim(self.target),  # suffix on /v1/completions, /infill
                        },
                    }
                ],
            }
        )

    async def tokenize(self, request: Request) -> Response:
        """vLLM's /tokenize ({"messages"} through the chat template, or {"prompt"}), which also takes llama-server's
        {"content"}: {"count", "max_model_len", "tokens"}. The window's context meter counts with it."""
        try:
            self.authorised(request)
            body = await self.read_body(request)
            if "messages" in body:
                tokens, _ = await run_in_threadpool(
                    self.config.in_flight.call, self.chat_tokens, parse_messages(body, answering=False), False
                )
            else:
                name = "prompt" if "prompt" in body else "content"
                text = body.get(name)
                if not isinstance(text, str):
                    raise ApiError(400, "Send 'messages', or the text as 'prompt' or 'content'.", param="prompt")
                checked_text(text, name)
                tokens = await run_in_threadpool(
                    self.config.in_flight.call, self.target.tokenize, text, body.get("add_special") is True, False
                )
        except ApiError as exc:
            return _error_response(exc)
        return JSONResponse({"count": len(tokens), "max_model_len": self.n_ctx, "tokens": tokens})

    async def health(self, request: Request) -> Response:
        load = self.scheduler.load()
        return JSONResponse(
            {
                "status": "ok",
                "slots_idle": load.parallel - load.running,
                "slots_processing": load.running,
                "requests_waiting": load.waiting,
            }
        )

    async def http_error(self, request: Request, exc: Exception) -> Response:
        exc = cast(HTTPException, exc)  # Starlette calls it for HTTPException only (exception_handlers)
        return _error_response(ApiError(exc.status_code, str(exc.detail), kind="invalid_request_error"))

    async def crashed(self, request: Request, exc: Exception) -> Response:
        log.exception("request %s failed", request.url.path)
        return _error_response(ApiError(500, f"The server failed: {type(exc).__name__}: {exc}", kind="server_error"))


async def _collect(feed: _Feed, parts: list[str]) -> None:
    async for delta in feed.deltas():
        parts.append(delta.text)
