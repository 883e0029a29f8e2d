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

Any web page can send requests to a loopback server: a "simple" cross-site POST (Content-Type text/plain, no
preflight) runs the model, and a page whose DNS name is rebound to 127.0.0.1 reads the answers. So, before any
route runs (RequestGuard), a request is refused when:
- its Host is not allowed (403 host_not_allowed). Allowed: localhost, a loopback address (127.0.0.0/8, [::1]),
  the address the server is bound to, and the names listed in ApiConfig.allowed_hosts (--allow-host), with or
  without a port. Bound to every interface (0.0.0.0 or ::, which needs an API key), any IP-address Host is
  allowed too, since clients on the network name the machine by its LAN address; a DNS name must still be listed,
  as a rebound name is exactly what a hostile page sends. A request without Host (HTTP/1.0) passes: browsers
  always send one;
- it carries an Origin (every browser request that a page makes across origins does) that is not among
  ApiConfig.cors_origins, unless those hold '*' (403 origin_not_allowed); clients that send no Origin (curl,
  editors, SDKs) are unaffected;
- it is a POST (every POST here takes a JSON body) whose Content-Type is not application/json, parameters such
  as charset aside (415 unsupported_media_type): a page can send application/json across origins only after a
  CORS preflight, which only the origins allowed above pass.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..chat_format import ChatFormatter, provably_too_long, utf8_size
from ..decoding.answer import Delta
from ..decoding.batch import Job
from ..decoding.jobs import job_for
from ..errors import EngineError
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
from .request_body import declared_length, parse_json, read_capped, too_large
from .scheduler import SERVER_STOPPED, QueueFull, Scheduler, ServerStopping

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1
DISCONNECT_POLL_S = 0.25
MAX_BODY_BYTES = 8 << 20  # a 128k-token conversation is ~0.5-1.5 MB of JSON; 20 MB took 72 s to refuse before
BODY_TIMEOUT_S = 30.0  # for the whole body to arrive once the headers have


@dataclass
class RequestRecord:
    """One served request, for a log: what the Server panel lists."""

    id: str
    endpoint: str
    client: str
    started: float  # time.time()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_per_s: float | None = None  # the response's timings.predicted_per_second (llama.cpp's count)
    acceptance_rate: float | None = None
    ttft_s: float | None = None
    method: str = "-"  # "-" for a request refused before it reached the engine
    finish: str | None = None
    status: int = 200


@dataclass
class ApiConfig:
    model_id: str
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    on_record: Callable[[RequestRecord], None] | None = None  # called on the event loop's thread
    records: list[RequestRecord] = field(default_factory=list)
    max_body_bytes: int = MAX_BODY_BYTES
    bind_host: str = "127.0.0.1"  # the address listened on: a Host that names it is allowed
    allowed_hosts: tuple[str, ...] = ()  # more names a Host may give (--allow-host)


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

    async def deltas(self):
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

    async def read_body(self, request: Request) -> dict:
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
        self, messages: list[dict], limit: bool = True, continue_last: bool = False
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

    def refuse_beyond_context(self, texts) -> None:
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

    def make_job(self, kind: str, tokens: list[int], gen: Generation, stop: list[str]) -> Job:
        budget = fit_prompt(tokens, gen.max_tokens, self.n_ctx)
        return job_for(f"{kind}-{uuid.uuid4().hex[:24]}", tokens, gen.sampling, budget, gen.ignore_eos, stop=stop)

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
        _keep(self.config, rec)

    def envelope(self, job: Job, kind: str) -> dict:
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

    def figures(self, job: Job) -> dict:
        return {"usage": usage(job.run.stats), "timings": timings(job.run.stats)}

    async def complete(self, request: Request, endpoint: str, chat: bool):
        job = None
        try:
            self.authorised(request)
            body = await self.read_body(request)
            gen = parse_generation(body, self.n_ctx)
            if chat:
                continuing = body.get("continue_final_message") is True  # vLLM's name: write more of the last answer
                messages = parse_messages(body, answering=not continuing)
                if continuing and messages[-1]["role"] != "assistant":
                    raise ApiError(400, "continue_final_message needs the assistant's answer last.", param="messages")
                tokens, template_stops = await run_in_threadpool(self.chat_tokens, messages, True, continuing)
                stop = [*gen.stop, *template_stops]
            else:
                tokens = await run_in_threadpool(self.prompt_tokens, parse_prompt(body))
                stop = gen.stop
            job = self.make_job("chatcmpl" if chat else "cmpl", tokens, gen, stop)
            feed = self.submit(job)
        except ApiError as exc:
            self.record(request, endpoint, job, exc.status)
            return _error_response(exc)
        if gen.stream:
            return EventSourceResponse(self.stream(request, endpoint, feed, chat, gen), ping=10, sep="\n")
        return await self.whole(request, endpoint, feed, chat)

    async def whole(self, request: Request, endpoint: str, feed: _Feed, chat: bool) -> JSONResponse:
        """A non-streamed answer; a client that hangs up first cancels it."""
        job, parts = feed.job, []
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

    async def stream(self, request: Request, endpoint: str, feed: _Feed, chat: bool, gen: Generation):
        job = feed.job
        kind = "chat.completion.chunk" if chat else "text_completion"

        produced = 0  # tokens streamed so far, counted from the deltas (the engine may be a step ahead)

        def chunk(content: str | None, reason: str | None = None, role: bool = False) -> dict:
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

    async def chat_completions(self, request: Request):
        return await self.complete(request, "/v1/chat/completions", chat=True)

    async def completions(self, request: Request):
        return await self.complete(request, "/v1/completions", chat=False)

    async def models(self, request: Request):
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
                        },
                    }
                ],
            }
        )

    async def tokenize(self, request: Request):
        """vLLM's /tokenize ({"messages"} through the chat template, or {"prompt"}), which also takes llama-server's
        {"content"}: {"count", "max_model_len", "tokens"}. The window's context meter counts with it."""
        try:
            self.authorised(request)
            body = await self.read_body(request)
            if "messages" in body:
                tokens, _ = await run_in_threadpool(self.chat_tokens, parse_messages(body, answering=False), False)
            else:
                name = "prompt" if "prompt" in body else "content"
                text = body.get(name)
                if not isinstance(text, str):
                    raise ApiError(400, "Send 'messages', or the text as 'prompt' or 'content'.", param="prompt")
                checked_text(text, name)
                tokens = await run_in_threadpool(self.target.tokenize, text, body.get("add_special") is True, False)
        except ApiError as exc:
            return _error_response(exc)
        return JSONResponse({"count": len(tokens), "max_model_len": self.n_ctx, "tokens": tokens})

    async def health(self, request: Request):
        load = self.scheduler.load()
        return JSONResponse(
            {
                "status": "ok",
                "slots_idle": load.parallel - load.running,
                "slots_processing": load.running,
                "requests_waiting": load.waiting,
            }
        )

    async def http_error(self, request: Request, exc: HTTPException):
        return _error_response(ApiError(exc.status_code, str(exc.detail), kind="invalid_request_error"))

    async def crashed(self, request: Request, exc: Exception):
        log.exception("request %s failed", request.url.path)
        return _error_response(ApiError(500, f"The server failed: {type(exc).__name__}: {exc}", kind="server_error"))


class RequestGuard:
    """Refuses a request a web page could have sent (see the module's docstring) before any route reads a byte
    of its body or the model does any work; each refusal is recorded, so the Server panel lists it."""

    def __init__(self, app, config: ApiConfig):
        self.app, self.config = app, config

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            refused = request_refusal(Headers(scope=scope), scope["method"], self.config)
            if refused is not None:
                client = scope.get("client")
                _keep(
                    self.config,
                    RequestRecord("-", scope["path"], client[0] if client else "?", time.time(), status=refused.status),
                )
                response = JSONResponse(
                    refused.body(), status_code=refused.status, headers={"Connection": "close"}
                )  # its body, if any, is never read
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def request_refusal(headers: Headers, method: str, config: ApiConfig) -> ApiError | None:
    """Why this request is refused (Host, then Origin, then Content-Type), or None."""
    host = headers.get("host")
    if host is not None and not host_allowed(host, config):
        return ApiError(
            403,
            f"Host {host!r} is not allowed: this server answers to {_answers_to(config)}. If it "
            "is this server's name, list it: --allow-host NAME, or Host names in SpecChat's Server "
            "panel (a web page can point any name at this machine).",
            kind="permission_error",
            code="host_not_allowed",
        )
    origin = headers.get("origin")
    if origin is not None and "*" not in config.cors_origins and origin not in config.cors_origins:
        return ApiError(
            403,
            f"Origin {origin!r} is not allowed: web pages may call this server only from the "
            "origins given with --cors ORIGIN (the Server panel's CORS origins).",
            kind="permission_error",
            code="origin_not_allowed",
        )
    media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
    if method == "POST" and media_type != "application/json":
        said = repr(media_type) if media_type else "missing"
        return ApiError(
            415, f"Content-Type {said}: this endpoint takes only 'application/json'.", code="unsupported_media_type"
        )
    return None


def host_allowed(host: str, config: ApiConfig) -> bool:
    name, bound = host_name(host), host_name(config.bind_host)
    if is_loopback(name) or name == bound or name in map(host_name, config.allowed_hosts):
        return True
    return _every_interface(bound) and _address(name) is not None  # an IP address; a DNS name must be listed


def _answers_to(config: ApiConfig) -> str:
    """The Hosts host_allowed takes, for a person (the listed names aside)."""
    bound = host_name(config.bind_host)
    if _every_interface(bound):
        return "localhost and IP addresses"
    if is_loopback(bound):
        return "localhost and loopback addresses"
    return f"localhost, loopback addresses and {bound}"


def is_loopback(host: str) -> bool:
    """localhost, or a loopback address (127.0.0.0/8, ::1)."""
    address = _address(host)
    return host == "localhost" or address is not None and address.is_loopback


def _every_interface(bound: str) -> bool:
    return bound in ("0.0.0.0", "::")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def host_name(host: str) -> str:
    """'Example.COM.:8765' -> 'example.com', '[::1]:80' -> '::1': the name or address a Host header gives."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.removesuffix(".")


def _keep(config: ApiConfig, rec: RequestRecord) -> None:
    config.records.append(rec)
    del config.records[:-1000]
    if config.on_record:
        config.on_record(rec)


async def _collect(feed: _Feed, parts: list[str]) -> None:
    async for delta in feed.deltas():
        parts.append(delta.text)
