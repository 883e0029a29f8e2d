"""Speculation lab: plain vs speculative decoding as concurrency rises, on this machine.

python -m engine.lab --model PATH|embedded [--draft PATH|embedded] --methods none,lookup[,draft]
    --concurrency 1,2,4,8 --prompts FILE.jsonl --max-tokens N --out DIR
    [--max-draft K] [--no-adaptive] [--repeats R] [--temperature T] [--seed S] [--threads N] [--stop-at-eos]

python -m engine.lab --engine-url [NAME=]URL [--engine-url ...] --concurrency 1,4,16,64,256 --prompts FILE.jsonl
    --max-tokens N --out DIR [--api-key-env NAME]
    the same experiment against running OpenAI-compatible servers (vLLM, llama-server, SpecChat), measured
    through engine.serve_bench's path (remote.py) into the same results, report and plot; name the plain
    one none=URL to get the speed-up and crossover.

Writes DIR/results.json (every figure per method × concurrency), DIR/plot.png (throughput and
inter-token latency vs concurrency) and DIR/summary.md (the table, the crossover, advice).
Cells run concurrency-major (none, lookup, ... at 1; then at 2; ...) so that whatever else the
machine is doing falls on the methods alike; --repeats R runs each cell R times and keeps the fastest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..errors import EngineError, GenerationCancelled
from ..methods import METHODS
from .local import LabConfig, run_lab
from .remote import RemoteLabConfig, parse_servers, run_remote_lab
from .report import summary_markdown, with_analysis, write_plot
from .schema import LabProgress


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.lab", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF path, or 'embedded' (needed unless --engine-url)")
    ap.add_argument(
        "--engine-url",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="a running OpenAI-compatible server instead of a model here (repeatable; e.g. "
        "none=http://gpu:8000 ngram=http://gpu:8001); --concurrency then counts clients, up to 1024",
    )
    ap.add_argument("--api-key-env", metavar="NAME", help="with --engine-url: the variable holding the API key")
    ap.add_argument("--draft", help="draft GGUF path, or 'embedded' (for the draft and auto methods)")
    ap.add_argument("--methods", default="none,lookup", help=f"comma-separated: {', '.join(METHODS)}")
    ap.add_argument("--concurrency", type=_int_list, default=(1, 2, 4, 8), help="levels, e.g. 1,2,4,8")
    ap.add_argument("--prompts", required=True, help='JSON lines of {"id", "prompt"}')
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--out", required=True, help="a folder for results.json, plot.png and summary.md")
    ap.add_argument("--max-draft", type=int, default=8, help="most draft tokens per sequence per step")
    ap.add_argument(
        "--no-adaptive",
        action="store_true",
        help="always draft --max-draft tokens (measures speculation itself, not the cost model)",
    )
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per cell, methods alternating; the fastest is kept (for a busy machine)",
    )
    ap.add_argument(
        "--stop-at-eos",
        action="store_true",
        help="end a request at its end token (default: "
        "every request decodes --max-tokens, so every method does the same work)",
    )
    ap.add_argument("--chat", action="store_true", help="each prompt as one user message in the chat template")
    args = ap.parse_args(argv)
    if bool(args.model) == bool(args.engine_url):
        ap.error("give --model (a model here) or --engine-url (running servers), not both")
    return args


def remote_config(args: argparse.Namespace) -> RemoteLabConfig:
    """The experiment against running servers (remote.py), one API key for all of them."""
    from ..remote.keys import key_from_env  # keyring: only a run against servers needs it

    servers, key = parse_servers(args.engine_url), key_from_env(args.api_key_env)
    return RemoteLabConfig(
        prompts=args.prompts,
        servers=servers,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
        ignore_eos=not args.stop_at_eos,
        repeats=args.repeats,
        api_keys={url: key for url in servers.values()} if key else {},
    )


def config_from_args(args: argparse.Namespace) -> LabConfig:
    return LabConfig(
        prompts=args.prompts,
        model=args.model,
        draft=args.draft,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        max_draft=args.max_draft,
        adaptive=not args.no_adaptive,
        temperature=args.temperature,
        seed=args.seed,
        threads=args.threads,
        n_gpu_layers=args.gpu_layers,
        ignore_eos=not args.stop_at_eos,
        repeats=args.repeats,
        chat=args.chat,
    )


class ConsoleProgress:
    """One line per cell, redrawn in place on a terminal; a line every few seconds otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self._last = 0.0

    def update(self, p: LabProgress) -> None:
        now = time.monotonic()
        if not self.live and now - self._last < 5.0:
            return
        self._last = now
        line = (
            f"[{p.cell}/{p.cells}] {p.method:>6} × {p.concurrency:<2} {100 * p.fraction:5.1f}% overall  "
            f"{p.generated}/{p.expected} tokens  {p.elapsed_s:5.1f} s"
        )
        self.stream.write(("\r" + line) if self.live else line + "\n")
        self.stream.flush()

    def cell_done(self, cell: dict) -> None:
        rate, full = cell["aggregate_tokens_per_s"], cell.get("full_tokens_per_s")
        acc = cell["acceptance_rate"]
        itl = cell["itl_p50_ms"]
        line = (
            f"{cell['method']:>6} × {cell['concurrency']:<2} {'n/a' if full is None else f'{full:.1f}':>7} tok/s "
            f"at full load, {rate or 0.0:.1f} aggregate, ITL p50 "
            f"{'n/a' if itl is None else f'{itl:.1f}'} ms, acceptance {'n/a' if acc is None else f'{acc:.0%}'}"
        )
        self.stream.write(("\r" + line + " " * 20 + "\n") if self.live else line + "\n")
        self.stream.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        console = ConsoleProgress()
        if args.engine_url:
            results = run_remote_lab(remote_config(args), console.update, console.cell_done)
        else:
            results = run_lab(config_from_args(args), console.update, console.cell_done)
    except (EngineError, OSError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, GenerationCancelled):
        print("\ncancelled", file=sys.stderr)
        return 130
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = with_analysis(results)
    (out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    write_plot([(results["settings"]["prompt_set"], results)], out / "plot.png")
    summary = summary_markdown(results)
    (out / "summary.md").write_text(summary, encoding="utf-8")
    print(summary)
    print(f"wrote {out / 'results.json'}, {out / 'plot.png'}, {out / 'summary.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
