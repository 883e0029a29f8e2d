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
import json
import subprocess
import sys
import time
from pathlib import Path

from .crossover import METHOD_COLOURS, crossover
from .serve_cell import named_url, run_cell, served_model, server

SCHEMA = "specchat-serve-bench/1"


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
        assert self.process.stdout is not None  # stdout=PIPE
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
    return ap.parse_args(argv)


def read_prompt_texts(path: str, ids: str | None) -> list[str]:
    """The prompts of a JSON-lines file, only those of the comma-separated ids where given."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if ids:
        wanted = ids.split(",")
        rows = [r for r in rows if r["id"] in wanted]
    if not rows:
        raise SystemExit("no prompts selected")
    return [r["prompt"] for r in rows]


def results_document(
    args: argparse.Namespace, prompts: list[str], servers: dict[str, str], spawned: bool, cells: list[dict]
) -> dict:
    """What results.json holds: the settings (the API key left out), the servers and every cell."""
    settings = {k: v for k, v in vars(args).items() if k != "api_key"}
    settings["model"] = args.model or (
        "embedded" if spawned else ", ".join(sorted({served_model(u, args) for u in servers.values()}))
    )
    return {
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prompts = read_prompt_texts(args.prompts, args.ids)
    spawned = [] if args.url else [SpawnedServer(m, args) for m in args.methods.split(",")]
    try:
        servers = {s.method: s.url for s in spawned} or dict(server_label(u, args) for u in args.url)
        cells = measure(servers, prompts, args)
    finally:
        for running in spawned:
            running.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = results_document(args, prompts, servers, bool(spawned), cells)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "summary.md").write_text(summary(results))
    plot(results, out / "plot.png")
    print(summary(results))
    return 0
