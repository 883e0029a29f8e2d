"""One cell against an OpenAI-compatible server: `clients` concurrent clients streaming chat (or completion)
requests, each one request after another, and the figures of what arrived here: aggregate and full-load tok/s,
TTFT and inter-token latency p50/p95 (a chunk of m tokens after a gap g counts as m gaps of g/m), and acceptance
from the server's timings, or from vLLM's /metrics counters before and after the cell (engine/remote/prometheus.py).
engine.serve_bench and the lab against servers (remote.py) both measure through run_cell.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from ..errors import EngineError
from ..remote import prometheus
from ..remote.client import RemoteEngine
from ..remote.endpoint import Endpoint


@dataclass
class RequestTrace:
    sent_at: float
    first_at: float | None = None
    done_at: float | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (when, completion tokens so far)
    completion_tokens: int = 0
    timings: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def tokens(self) -> int:
        """Its tokens: the server's count at the end, or as streamed so far (one cut short)."""
        return self.completion_tokens or (self.chunks[-1][1] if self.chunks else 0)

    def client_tokens_per_s(self) -> float | None:
        """Tokens after the first ÷ the time after the first, as they arrived here."""
        if self.first_at is None or not self.chunks or self.completion_tokens < 2:
            return None
        span = self.chunks[-1][0] - self.first_at
        return (self.completion_tokens - 1) / span if span > 0 else None

    def gaps(self) -> list[float]:
        if self.first_at is None:
            return []  # nothing arrived
        out: list[float] = []
        t0, n0 = self.first_at, (self.chunks[0][1] if self.chunks else 0)
        for t1, n1 in self.chunks[1:]:
            if n1 > n0:
                out += [(t1 - t0) / (n1 - n0)] * (n1 - n0)
                t0, n0 = t1, n1
        return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def full_load_rate(traces: list[RequestTrace], end: float) -> float | None:
    """Tokens per second streamed while the server answered as many requests at once as it ever did in the level
    (every client's, unless it serves fewer in parallel), each past its first token and before its last, so prefills
    are left out: the local lab's full-load figure (metrics.py) as clients can see it. A trace cut short (a
    filler) counts as answered until `end`."""
    events = sorted(
        (when, change)
        for t in traces
        if t.first_at is not None
        for when, change in ((t.first_at, 1), (t.done_at or end, -1))
    )
    counts = [0]
    for _, change in events:
        counts.append(counts[-1] + change)
    peak = max(counts)
    starts: list[float] = []
    stops: list[float] = []
    for (when, _), busy in zip(events, counts[1:]):
        if busy >= peak and len(starts) == len(stops):
            starts.append(when)
        elif busy < peak and len(starts) > len(stops):
            stops.append(when)
    stops += [end] * (len(starts) - len(stops))
    seconds = sum(b - a for a, b in zip(starts, stops))
    tokens = 0
    for t in traces:  # each chunk after the first, by when it arrived (the first came with the prefill)
        for (_, before), (when, so_far) in zip(t.chunks, t.chunks[1:]):
            i = bisect.bisect_left(starts, when) - 1
            if i >= 0 and when <= stops[i]:
                tokens += so_far - before
    return tokens / seconds if seconds > 0 else None


def _request_body(prompt: str, args, model: str) -> dict:
    chat = args.endpoint == "chat"
    return {
        "model": model,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": args.ignore_eos,
        **({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}),
    }


def _note_chunk(trace: RequestTrace, chunk: dict, now: float) -> None:
    """What one streamed chunk says: a token's arrival, the server's timings, its count of tokens."""
    choices = chunk.get("choices") or []
    if choices and ((choices[0].get("delta") or {}).get("content") or choices[0].get("text")):
        trace.first_at = trace.first_at or now
        # A server without continuous usage (llama-server) streams one token per chunk.
        so_far = (chunk.get("usage") or {}).get("completion_tokens", len(trace.chunks) + 1)
        trace.chunks.append((now, so_far))
    if "timings" in chunk:
        trace.timings = chunk["timings"]
    usage = chunk.get("usage") or {}
    if "completion_tokens" in usage or trace.timings:  # vLLM's last chunk has usage, no timings
        trace.completion_tokens = usage.get("completion_tokens", trace.timings.get("predicted_n", len(trace.chunks)))


async def one_request(
    client: httpx.AsyncClient, url: str, prompt: str, args, model: str = "bench", trace: RequestTrace | None = None
) -> RequestTrace:
    path = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    trace = trace or RequestTrace(time.perf_counter())
    try:
        async with client.stream("POST", url + path, json=_request_body(prompt, args, model)) as response:
            if response.status_code != 200:
                trace.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return trace
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                _note_chunk(trace, chunk, time.perf_counter())
    except httpx.HTTPError as exc:
        trace.error = f"{type(exc).__name__}: {exc}"
    trace.done_at = time.perf_counter()
    return trace


class _Clients:
    """A cell's clients against one server: each sends its requests one after another, numbered so that no prompt
    is found cached; with keep_full, one done with its own sends fillers until every client is."""

    def __init__(self, client: httpx.AsyncClient, url: str, prompts: list[str], args, model: str, first_number: int):
        self.client, self.url, self.prompts, self.args, self.model = client, url, prompts, args, model
        self.first_number = first_number
        self.fillers: list[RequestTrace] = []
        self.answered = asyncio.Event()

    def numbered(self, n: int) -> str:
        # A number first, unique in the whole run, so no request finds its prompt cached from an
        # earlier one (in this cell or an earlier one, on any server): TTFT includes the prefill, as it
        # would for prompts that do not repeat.
        return f"({self.first_number + n}) {self.prompts[n % len(self.prompts)]}"

    async def fill(self, first: int, cancel: threading.Event | None) -> None:
        """Fillers, numbered from `first`, until every client is answered (the last cut short then)."""
        while not self.answered.is_set() and not (cancel is not None and cancel.is_set()):
            self.fillers.append(RequestTrace(time.perf_counter()))
            request = asyncio.ensure_future(
                one_request(
                    self.client,
                    self.url,
                    self.numbered(first + len(self.fillers) - 1),
                    self.args,
                    self.model,
                    self.fillers[-1],
                )
            )
            ended = asyncio.ensure_future(self.answered.wait())
            await asyncio.wait({request, ended}, return_when=asyncio.FIRST_COMPLETED)
            for task in (request, ended):
                task.cancel()  # a filler still streaming is cut short: its tokens so far count
            await asyncio.gather(request, ended, return_exceptions=True)

    async def run(
        self,
        clients: int,
        on_request: Callable[[RequestTrace], None] | None,
        cancel: threading.Event | None,
        keep_full: bool,
    ) -> list[RequestTrace]:
        """Every client's requests (fillers apart, in self.fillers), in the clients' order."""
        requests, busy = self.args.requests, clients  # busy: clients still sending their own requests

        async def one_client(index: int) -> list[RequestTrace]:
            nonlocal busy
            out = []
            for r in range(requests):
                if cancel is not None and cancel.is_set():
                    break
                out.append(
                    await one_request(self.client, self.url, self.numbered(index * requests + r), self.args, self.model)
                )
                if on_request is not None:
                    on_request(out[-1])
            busy -= 1
            if not busy:
                self.answered.set()
            if keep_full:
                await self.fill(clients * requests, cancel)
            return out

        per_client = await asyncio.gather(*(one_client(i) for i in range(clients)))
        return [t for traces in per_client for t in traces]


async def run_cell(
    url: str,
    prompts: list[str],
    clients: int,
    args,
    first_number: int = 1,
    on_request: Callable[[RequestTrace], None] | None = None,
    cancel: threading.Event | None = None,
    keep_full: bool = False,
) -> dict:
    """`clients` concurrent clients, each sending `args.requests` requests one after another, numbered from
    first_number on. on_request hears of each finished request; a set cancel sends no further request.
    keep_full: a client done with its requests sends fillers (the prompts again, in turn) until every client is,
    the last one cut short then, so the server stays at `clients` to the end (as the local lab's levels do)."""
    before, model = spec_counters(url, args), served_model(url, args)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), headers=_auth(args)) as client:
        sending = _Clients(client, url, prompts, args, model, first_number)
        started = time.perf_counter()
        traces = await sending.run(clients, on_request, cancel, keep_full)
        wall = time.perf_counter() - started
    moved = prometheus.delta(before, spec_counters(url, args) or prometheus.SpecCounters()) if before else None
    return cell_figures(clients, traces, sending.fillers, started, wall, moved)


def _acceptance(good: list[RequestTrace], moved: prometheus.SpecDelta | None) -> dict:
    """Drafted and accepted tokens from the servers' timings, or (vLLM: no timings) its counters over the cell."""
    drafted = sum(t.timings.get("draft_n", 0) for t in good)
    accepted = sum(t.timings.get("draft_n_accepted", 0) for t in good)
    steps_mean: list[float] = [
        t.timings["mean_acceptance_length"] for t in good if t.timings.get("mean_acceptance_length")
    ]
    source = "timings" if drafted else None
    if not drafted and moved is not None and moved.drafted:
        drafted, accepted, source = moved.drafted, moved.accepted, "/metrics"
        mean = moved.mean_acceptance_length
        steps_mean = [mean] if mean is not None else []
    return {
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_acceptance_length": statistics.fmean(steps_mean) if steps_mean else None,
        "acceptance_source": source,
    }


def cell_figures(
    clients: int,
    traces: list[RequestTrace],
    fillers: list[RequestTrace],
    started: float,
    wall: float,
    moved: prometheus.SpecDelta | None,
) -> dict:
    """A cell's figures from its requests' traces (fillers apart) and the server's counters' move over it."""
    errors = [t.error for t in traces if t.error]
    good = [t for t in traces if not t.error]
    tokens = sum(t.completion_tokens for t in good)
    filler_tokens = sum(t.tokens for t in fillers)
    gaps = [g for t in good for g in t.gaps()]
    ttfts = [t.first_at - t.sent_at for t in good if t.first_at]
    e2e = [t.done_at - t.sent_at for t in good if t.done_at is not None]  # every good one is done
    rates = [r for r in (t.client_tokens_per_s() for t in good) if r is not None]
    return {
        "clients": clients,
        "requests": len(traces),
        "errors": errors,
        "completion_tokens": tokens,
        "wall_s": wall,
        "filler_requests": len(fillers),
        "filler_tokens": filler_tokens,
        "full_tokens_per_s": full_load_rate(good + fillers, started + wall),
        "aggregate_tokens_per_s": (tokens + filler_tokens) / wall if wall > 0 else None,
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p95_s": percentile(ttfts, 0.95),
        "itl_p50_s": percentile(gaps, 0.5),
        "itl_p95_s": percentile(gaps, 0.95),
        "e2e_p50_s": percentile(e2e, 0.5),
        "e2e_p95_s": percentile(e2e, 0.95),
        "client_tokens_per_s": statistics.fmean(rates) if rates else None,
        **_acceptance(good, moved),
        "per_request": [
            {
                "tokens": t.completion_tokens,
                "tokens_per_s": t.timings.get("predicted_per_second"),
                "ttft_s": t.first_at - t.sent_at if t.first_at else None,
            }
            for t in good
        ],
    }


def _auth(args) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def server(url: str, args) -> RemoteEngine:
    """The server at url as engine/remote sees it: its models and its spec-decode counters (vLLM's /metrics)."""
    return RemoteEngine(Endpoint(url, "", args.api_key))


def served_model(url: str, args) -> str:
    """The first model the server lists (vLLM answers only requests that name one of its models)."""
    try:
        with server(url, args) as remote:
            return remote.models()[0].id
    except EngineError:
        return "bench"


def spec_counters(url: str, args) -> prometheus.SpecCounters | None:
    """The server's spec-decode counters now, or None where it has none."""
    with server(url, args) as remote:
        return remote.spec_counters()


def named_url(spec: str) -> tuple[str, str]:
    """NAME=URL as (NAME, URL); a bare URL as ("", URL)."""
    name, _, url = spec.partition("=") if "=" in spec.split("://")[0] else ("", "", spec)
    return name.strip(), url.rstrip("/")
