"""`python -m engine.serve_bench`: N concurrent clients against OpenAI-compatible servers, plain vs speculative.

Either servers already running (--url, repeatable) or servers it starts itself, one per --methods entry
(`python -m engine.serve --port 0 ...`, all loaded at once and idle while another is measured). Each cell
(a server at a number of clients) streams the prompts as chat requests, every client one request after
another; cells alternate between servers and repeat, and the fastest run of a cell is kept (other work
on the machine only slows a run down). Per cell: aggregate tok/s, TTFT and inter-token latency p50/p95
(a chunk of m tokens after a gap g counts as m gaps of g/m), and mean accepted length from the server's
timings, or from vLLM's /metrics counters before and after the cell (engine/remote/prometheus.py). The summary
says where speculation stops paying (report.crossover, as the lab's). Writes results.json, summary.md and
plot.png to --out. `python -m engine.lab --engine-url` runs the same path.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..errors import EngineError
from ..remote import prometheus
from ..remote.client import RemoteEngine
from ..remote.endpoint import Endpoint

SCHEMA = "specchat-serve-bench/1"


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
        out, (t0, n0) = [], (self.first_at, self.chunks[0][1] if self.chunks else 0)
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
    starts, stops = [], []
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


async def one_request(
    client: httpx.AsyncClient, url: str, prompt: str, args, model: str = "bench", trace: RequestTrace | None = None
) -> RequestTrace:
    chat = args.endpoint == "chat"
    body = {
        "model": model,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": args.ignore_eos,
        **({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}),
    }
    trace = trace or RequestTrace(time.perf_counter())
    try:
        async with client.stream(
            "POST", url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body
        ) as response:
            if response.status_code != 200:
                trace.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return trace
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
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
                    trace.completion_tokens = usage.get(
                        "completion_tokens", trace.timings.get("predicted_n", len(trace.chunks))
                    )
    except httpx.HTTPError as exc:
        trace.error = f"{type(exc).__name__}: {exc}"
    trace.done_at = time.perf_counter()
    return trace


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
    real = clients * args.requests
    fillers: list[RequestTrace] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), headers=_auth(args)) as client:
        answered, busy = asyncio.Event(), clients  # busy: clients still sending their own requests

        def numbered(n: int) -> str:
            # A number first, unique in the whole run, so no request finds its prompt cached from an
            # earlier one (in this cell or an earlier one, on any server): TTFT includes the prefill, as it
            # would for prompts that do not repeat.
            return f"({first_number + n}) {prompts[n % len(prompts)]}"

        async def fill() -> None:
            while not answered.is_set() and not (cancel is not None and cancel.is_set()):
                fillers.append(RequestTrace(time.perf_counter()))
                request = asyncio.ensure_future(
                    one_request(client, url, numbered(real + len(fillers) - 1), args, model, fillers[-1])
                )
                ended = asyncio.ensure_future(answered.wait())
                await asyncio.wait({request, ended}, return_when=asyncio.FIRST_COMPLETED)
                for task in (request, ended):
                    task.cancel()  # a filler still streaming is cut short: its tokens so far count
                await asyncio.gather(request, ended, return_exceptions=True)

        async def one_client(index: int) -> list[RequestTrace]:
            nonlocal busy
            out = []
            for r in range(args.requests):
                if cancel is not None and cancel.is_set():
                    break
                out.append(await one_request(client, url, numbered(index * args.requests + r), args, model))
                if on_request is not None:
                    on_request(out[-1])
            busy -= 1
            if not busy:
                answered.set()
            if keep_full:
                await fill()
            return out

        started = time.perf_counter()
        traces = [
            t for per_client in await asyncio.gather(*(one_client(i) for i in range(clients))) for t in per_client
        ]
        wall = time.perf_counter() - started
    errors = [t.error for t in traces if t.error]
    good = [t for t in traces if not t.error]
    tokens = sum(t.completion_tokens for t in good)
    filler_tokens = sum(t.tokens for t in fillers)
    gaps = [g for t in good for g in t.gaps()]
    ttfts = [t.first_at - t.sent_at for t in good if t.first_at]
    e2e = [t.done_at - t.sent_at for t in good]
    rates = [r for r in (t.client_tokens_per_s() for t in good) if r is not None]
    drafted = sum(t.timings.get("draft_n", 0) for t in good)
    accepted = sum(t.timings.get("draft_n_accepted", 0) for t in good)
    steps_mean = [t.timings.get("mean_acceptance_length") for t in good if t.timings.get("mean_acceptance_length")]
    source = "timings" if drafted else None
    moved = prometheus.delta(before, spec_counters(url, args) or prometheus.SpecCounters()) if before else None
    if not drafted and moved is not None and moved.drafted:  # vLLM: no timings, its counters over the cell
        drafted, accepted, source = moved.drafted, moved.accepted, "/metrics"
        steps_mean = [moved.mean_acceptance_length]
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
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_acceptance_length": statistics.fmean(steps_mean) if steps_mean else None,
        "acceptance_source": source,
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


# --- servers ------------------------------------------------------------------------------------
class SpawnedServer:
    """`python -m engine.serve` in a child process, on a free port."""

    def __init__(self, method: str, args):
        command = [
            sys.executable,
            "-m",
            "engine.serve",
            "--model",
            args.model or "embedded",
            "--method",
            method,
            "--port",
            "0",
            "--parallel",
            str(max(args.clients)),
            "--ctx",
            str(args.ctx),
        ]
        if args.draft:
            command += ["--draft", args.draft]
        if args.threads:
            command += ["--threads", str(args.threads)]
        if not args.remember:  # the prompts repeat across clients: earlier answers would be replayed
            command.append("--no-remember")
        self.method = method
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        for line in self.process.stdout:
            if " at http://" in line:
                self.url = line.rsplit(" at ", 1)[1].strip().removesuffix("/v1")
                break
        else:
            raise SystemExit(f"the {method} server did not start (exit code {self.process.wait()})")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def named_url(spec: str) -> tuple[str, str]:
    """NAME=URL as (NAME, URL); a bare URL as ("", URL)."""
    name, _, url = spec.partition("=") if "=" in spec.split("://")[0] else ("", "", spec)
    return name.strip(), url.rstrip("/")


def server_label(spec: str, args) -> tuple[str, str]:
    """NAME=URL, or a URL named by the method its /v1/models reports (SpecChat's servers say)."""
    name, url = named_url(spec)
    if not name:
        with server(url, args) as remote:
            name = remote.models()[0].meta.get("method", url)
    return name, url


# --- the run --------------------------------------------------------------------------------------
def measure(servers: dict[str, str], prompts: list[str], args) -> list[dict]:
    for url in servers.values():  # warm-up: first decodes allocate buffers and fault pages in
        asyncio.run(run_cell(url, prompts[:1], 1, argparse.Namespace(**{**vars(args), "requests": 1})))
    runs: dict[tuple[str, int], list[dict]] = {}
    order = list(servers)
    number = 1000  # past the warm-up's numbers; every server gets the same prompts in a cell
    for repeat in range(args.repeats):
        for clients in args.clients:
            for method in order if repeat % 2 == 0 else order[::-1]:  # alternate, so outside load falls alike
                cell = asyncio.run(run_cell(servers[method], prompts, clients, args, number))
                cell["method"] = method
                runs.setdefault((method, clients), []).append(cell)
                print(
                    f"  {method:>6} × {clients}: {cell['aggregate_tokens_per_s']:.1f} tok/s"
                    + (f"  ({len(cell['errors'])} errors)" if cell["errors"] else ""),
                    flush=True,
                )
            number += clients * args.requests
    cells = []
    for repeats in runs.values():
        best = dict(max(repeats, key=lambda c: c["aggregate_tokens_per_s"] or 0.0))
        best["aggregate_tokens_per_s_runs"] = [c["aggregate_tokens_per_s"] for c in repeats]
        cells.append(best)
    return cells


def summary(results: dict) -> str:
    cells = {(c["method"], c["clients"]): c for c in results["cells"]}
    methods = list(dict.fromkeys(c["method"] for c in results["cells"]))
    base = "none" if "none" in methods else methods[0]
    s = results["settings"]
    lines = [
        f"Server load: {s['model']}, prompts {s['prompt_set']} ({s['prompt_count']}), {s['max_tokens']} tokens max, "
        f"temperature {s['temperature']}, {s['requests']} requests per client, best of {s['repeats']}.",
        "",
        "| clients | method | aggregate tok/s | vs plain | TTFT p50 / p95 (ms) | inter-token p50 / p95 (ms) "
        "| mean accepted length |",
        "|---|---|---|---|---|---|---|",
    ]

    def ms(x):
        return f"{1000 * x:.0f}" if x is not None else "n/a"

    for clients in sorted({c["clients"] for c in results["cells"]}):
        for method in methods:
            c = cells.get((method, clients))
            if not c:
                continue
            plain = cells.get((base, clients))
            ratio = (
                f"{c['aggregate_tokens_per_s'] / plain['aggregate_tokens_per_s']:.2f}×"
                if plain and plain["aggregate_tokens_per_s"]
                else "n/a"
            )
            mal = f"{c['mean_acceptance_length']:.2f}" if c["mean_acceptance_length"] else "n/a"
            lines.append(
                f"| {clients} | {method} | {c['aggregate_tokens_per_s']:.1f} | {ratio} | "
                f"{ms(c['ttft_p50_s'])} / {ms(c['ttft_p95_s'])} | {ms(c['itl_p50_s'])} / {ms(c['itl_p95_s'])} "
                f"| {mal} |"
            )
    return "\n".join(lines + [""] + crossover_lines(results, methods, base)) + "\n"


def crossover_lines(results: dict, methods: list[str], base: str) -> list[str]:
    """Where each speculating server stops paying against the plain one, as the lab says it."""
    from .report import crossover

    as_lab = {"cells": [{**c, "concurrency": c["clients"]} for c in results["cells"]]}
    lines = []
    for method in methods:
        found = crossover(as_lab, method, base) if method != base else None
        if found is None:
            continue
        if found.stops_at is None:
            lines.append(f"- {method} paid at every level measured (up to {found.pays_up_to} clients).")
        elif found.pays_up_to is None:
            lines.append(f"- {method} did not pay even at {found.stops_at} client{'s' if found.stops_at > 1 else ''}.")
        else:
            lines.append(
                f"- {method} stops paying between {found.pays_up_to} and {found.stops_at} clients "
                f"(about {found.estimate:.0f}, interpolated)."
            )
    return lines


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from .report import METHOD_COLOURS

    colours = {**METHOD_COLOURS, "llama-server": "#8c564b", "llama-server-ngram": "#ff7f0e"}
    cells = results["cells"]
    methods = list(dict.fromkeys(c["method"] for c in cells))
    levels = sorted({c["clients"] for c in cells})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    by = {(c["method"], c["clients"]): c for c in cells}
    for method in methods:
        xs = [n for n in levels if (method, n) in by]
        style = "o--" if method.startswith("llama-server") else "o-"  # another program, for reference
        left.plot(
            xs, [by[(method, n)]["aggregate_tokens_per_s"] for n in xs], style, label=method, color=colours.get(method)
        )
        if method != "none" and "none" in methods:
            right.plot(
                xs,
                [by[(method, n)]["aggregate_tokens_per_s"] / by[("none", n)]["aggregate_tokens_per_s"] for n in xs],
                style,
                label=method,
                color=colours.get(method),
            )
    left.set(xscale="log", xlabel="concurrent clients", ylabel="aggregate tokens/s", title="Throughput")
    right.axhline(1.0, color="#555555", lw=1, ls="--")
    right.set(xscale="log", xlabel="concurrent clients", ylabel="× plain decoding", title="Speed-up over plain")
    for ax in (left, right):
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.legend()
        ax.grid(alpha=0.3)
    s = results["settings"]
    fig.suptitle(f"{s.get('title') or Path(s['model']).name}: {s['prompt_set']} prompts, {s['endpoint']} endpoint")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m engine.serve_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="a running server (repeatable); NAME labels it, e.g. llama-server=http://127.0.0.1:8080",
    )
    ap.add_argument("--model", help="for servers started here (default: the embedded model)")
    ap.add_argument("--draft")
    ap.add_argument("--methods", default="none,lookup", help="servers started here, one per method")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--api-key")
    ap.add_argument(
        "--remember",
        action="store_true",
        help="let lookup in the servers started here search earlier answers (off: prompts repeat)",
    )
    ap.add_argument("--clients", type=_ints, default=[1, 2, 4, 8])
    ap.add_argument("--requests", type=int, default=3, help="requests each client sends, one after another")
    ap.add_argument("--prompts", default="resources/prompts/heldout.jsonl")
    ap.add_argument("--ids", help="comma-separated prompt ids to keep (default: all)")
    ap.add_argument(
        "--endpoint",
        choices=("chat", "completions"),
        default="chat",
        help="chat: each prompt as a user message; completions: the raw prompt (base models)",
    )
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--ignore-eos", action="store_true", help="every answer runs to --max-tokens, so each server does the same work"
    )
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--title", help="the plot's title (default: --model)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    if args.ids:
        wanted = args.ids.split(",")
        rows = [r for r in rows if r["id"] in wanted]
    if not rows:
        raise SystemExit("no prompts selected")
    prompts = [r["prompt"] for r in rows]
    spawned = [] if args.url else [SpawnedServer(m, args) for m in args.methods.split(",")]
    try:
        servers = {s.method: s.url for s in spawned} or dict(server_label(u, args) for u in args.url)
        cells = measure(servers, prompts, args)
    finally:
        for server in spawned:
            server.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "api_key"}
    settings["model"] = args.model or (
        "embedded" if spawned else ", ".join(sorted({served_model(u, args) for u in servers.values()}))
    )
    results = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {
            **settings,
            "prompt_set": Path(args.prompts).stem + (f" [{args.ids}]" if args.ids else ""),
            "prompt_count": len(prompts),
            "servers": servers,
        },
        "cells": cells,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "summary.md").write_text(summary(results))
    plot(results, out / "plot.png")
    print(summary(results))
    return 0
