"""Speculation lab: plain vs speculative decoding as concurrency rises, on this machine.

python -m engine.lab --model PATH|embedded [--draft PATH|embedded] --methods none,lookup[,draft]
    --concurrency 1,2,4,8 --prompts FILE.jsonl --max-tokens N --out DIR
    [--max-draft K] [--no-adaptive] [--repeats R] [--temperature T] [--seed S] [--threads N] [--stop-at-eos]

python -m engine.lab --engine-url [NAME=]URL [--engine-url ...] --concurrency 1,4,16,64,256 --prompts FILE.jsonl
    --max-tokens N --out DIR [--api-key-env NAME]
    the same experiment against running OpenAI-compatible servers (vLLM, llama-server, SpecChat), measured
    through engine.serve_bench's path (remote_lab.py) into the same results, report and plot; name the plain
    one none=URL to get the speed-up and crossover.

Writes DIR/results.json (every figure per method × concurrency), DIR/plot.png (throughput and
inter-token latency vs concurrency) and DIR/summary.md (the table, the crossover, advice).
Cells run concurrency-major (none, lookup, ... at 1; then at 2; ...) so that whatever else the
machine is doing falls on the methods alike; --repeats R runs each cell R times and keeps the fastest.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import llama_cpp
import torch

from ..chat_format import ChatFormatter
from ..decoding.batch_decode import BatchDecoder, BatchProgress, BatchRequest
from .bench import read_prompts
from ..decoding.cost_model import SpeculationConfig
from ..modelfiles.embedded import resolve_model
from ..errors import EngineError, InvalidSettingError
from .lab_metrics import UtilisationMeter, memory_figure, summarise_cell
from .lab_report import least_disturbed
from ..decoding.loader import DRAFT_METHODS, METHODS, proposer_for, require_rollback
from ..decoding.runtime import LoadSettings, Model
from ..decoding.sampling import SamplingParams

SCHEMA = "specchat-lab/1"
CTX_ALIGN = 256


@dataclass
class LabConfig:
    prompts: str  # a JSON-lines file of {"id", "prompt"}
    model: str = "embedded"
    draft: str | None = None
    methods: tuple[str, ...] = ("none", "lookup")
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    max_tokens: int = 128
    max_draft: int = 8
    adaptive: bool = True  # the chat's default: measured acceptance and step times pick draft lengths
    temperature: float = 0.0
    seed: int = 0
    threads: int | None = None
    n_gpu_layers: int = -1
    ignore_eos: bool = True  # every request decodes max_tokens: the same work for every method
    repeats: int = 1  # runs per cell; the fastest is kept (a shared machine only slows runs down)
    chat: bool = False  # each prompt as one user message in the model's chat template (an instruct model's use)

    def __post_init__(self) -> None:
        self.methods = tuple(self.methods)
        self.concurrency = tuple(sorted(set(self.concurrency)))
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise InvalidSettingError(f"methods must be some of {', '.join(METHODS)}, got {list(self.methods)}")
        if set(self.methods) & set(DRAFT_METHODS) and not self.draft:
            raise InvalidSettingError("The draft and auto methods need a draft model (--draft PATH or embedded).")
        if not self.concurrency or any(not isinstance(c, int) or not 1 <= c <= 64 for c in self.concurrency):
            raise InvalidSettingError(f"concurrency levels must be whole numbers 1..64, got {list(self.concurrency)}")
        if not (isinstance(self.max_tokens, int) and 1 <= self.max_tokens <= 8192):
            raise InvalidSettingError(f"max tokens must be 1..8192, got {self.max_tokens!r}")
        if not (isinstance(self.repeats, int) and 1 <= self.repeats <= 20):
            raise InvalidSettingError(f"repeats must be 1..20, got {self.repeats!r}")
        SpeculationConfig(max_draft=self.max_draft, adaptive=self.adaptive)  # validates the draft length
        SamplingParams(temperature=self.temperature, seed=self.seed)


@dataclass(frozen=True)
class LabProgress:
    fraction: float  # of the whole run, 0..1
    cell: int  # 1-based
    cells: int
    method: str
    concurrency: int
    generated: int  # tokens so far in this cell
    expected: int  # tokens this cell will produce at most
    elapsed_s: float  # in this cell


def plan_requests(prompts: list[dict], tokenize, concurrency: int) -> list[BatchRequest]:
    """Every prompt at least once, and a whole number of rounds of `concurrency` requests, so each
    level is measured on the same prompts (fillers keep it at that concurrency to the end: BatchDecoder.run)."""
    count = concurrency * math.ceil(len(prompts) / concurrency)
    tokens = [tokenize(p["prompt"]) for p in prompts]
    return [BatchRequest(f"{prompts[i % len(prompts)]['id']}#{i}", tokens[i % len(prompts)]) for i in range(count)]


def prompt_tokenizer(model: Model, chat: bool) -> Callable[[str], list[int]]:
    """A prompt's tokens: the raw text, or (chat) one user message through the model's chat template."""
    if not chat:
        return model.tokenize
    formatter = ChatFormatter(model)
    return lambda text: formatter.render([{"role": "user", "content": text}])[1]


def context_size(longest_prompt: int, config: LabConfig) -> int:
    """The unified KV cache holds every sequence in flight: size it for the busiest level."""
    per_sequence = longest_prompt + config.max_tokens + config.max_draft + 2
    need = max(config.concurrency) * per_sequence
    return CTX_ALIGN * math.ceil(need / CTX_ALIGN)


def _drafter(method: str, target: Model, draft: Model | None):
    # Requests repeat the same prompts: earlier answers would be copied, which a user never sees.
    return proposer_for(method, target, draft, remember_requests=False)


def run_lab(config: LabConfig, on_progress: Callable[[LabProgress], None] | None = None,
            on_cell: Callable[[dict], None] | None = None, cancel: threading.Event | None = None) -> dict:
    """Run every (method, concurrency) cell; return the results document (see SCHEMA).
    Raises GenerationCancelled when cancel is set, EngineError subclasses on bad input."""
    cancel = cancel or threading.Event()
    prompts = read_prompts(config.prompts)
    if not prompts:
        raise InvalidSettingError(f"{config.prompts} holds no prompts")
    slots = max(config.concurrency)
    probe = Model(resolve_model(config.model), vocab_only=True)  # tokenize first, to size the context
    tokenize = prompt_tokenizer(probe, config.chat)
    longest = max(len(tokenize(p["prompt"])) for p in prompts)
    probe.close()
    load = LoadSettings(n_ctx=context_size(longest, config), n_gpu_layers=config.n_gpu_layers,
                        threads=config.threads, n_seq_max=slots)
    target = Model(resolve_model(config.model), load)
    draft = None
    try:
        if load.n_ctx > target.n_ctx:
            raise InvalidSettingError(f"{slots} sequences of up to {longest + config.max_tokens} tokens need a "
                                      f"{load.n_ctx}-token context; this model holds {target.n_ctx}. "
                                      "Lower the concurrency or max tokens.")
        if set(config.methods) & set(DRAFT_METHODS):
            draft = Model(resolve_model(config.draft), load)
            if load.n_ctx > draft.n_ctx:  # its cache follows every sequence too
                raise InvalidSettingError(f"The draft model holds {draft.n_ctx} tokens; {slots} sequences need "
                                          f"{load.n_ctx}. Lower the concurrency or max tokens.")
        if set(config.methods) - {"none"}:
            require_rollback(target, draft)
        sampling = SamplingParams(temperature=config.temperature, seed=config.seed)
        speculation = SpeculationConfig(max_draft=config.max_draft, adaptive=config.adaptive)
        _warm_up(target, sampling, prompts)
        cells: list[dict] = []
        per_level = [(repeat, m) for repeat in range(config.repeats) for m in config.methods]
        cells_total = len(config.concurrency) * len(per_level)
        index = 0
        for concurrency in config.concurrency:
            requests = plan_requests(prompts, prompt_tokenizer(target, config.chat), concurrency)
            expected = len(requests) * config.max_tokens
            measured: dict[str, list[dict]] = {m: [] for m in config.methods}
            for _, method in per_level:  # methods alternate, so outside load falls on them alike
                decoder = BatchDecoder(target, _drafter(method, target, draft), speculation)

                def progress(p: BatchProgress, index=index, concurrency=concurrency, method=method) -> None:
                    if on_progress:
                        share = min(p.generated / expected, 1.0)
                        on_progress(LabProgress((index + share) / cells_total, index + 1, cells_total, method,
                                                concurrency, p.generated, expected, p.elapsed_s))

                with UtilisationMeter(target.backend) as meter:
                    result = decoder.run(requests, concurrency, sampling, config.max_tokens,
                                         ignore_eos=config.ignore_eos, cancel=cancel, on_progress=progress,
                                         keep_full=True)
                cell = summarise_cell(result, method, concurrency)
                cell["utilisation"] = meter.result.to_dict()
                cell["memory"] = memory_figure(target.backend)
                measured[method].append(cell)
                index += 1
            for method in config.methods:
                cell = least_disturbed(measured[method])
                cells.append(cell)
                if on_cell:
                    on_cell(cell)
        return {
            "schema": SCHEMA,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "settings": {**asdict(config), "prompt_set": Path(config.prompts).stem, "prompt_count": len(prompts)},
            "env": _environment(target, draft, load),
            "cells": cells,
        }
    finally:
        target.close()
        if draft is not None:
            draft.close()


def _warm_up(target: Model, sampling: SamplingParams, prompts: list[dict]) -> None:
    """First decodes allocate buffers and fault pages in: keep that out of the first cell."""
    request = BatchRequest("warm-up", target.tokenize(prompts[0]["prompt"]))
    BatchDecoder(target).run([request], 1, sampling, max_tokens=4, ignore_eos=True)


def _environment(target: Model, draft: Model | None, load: LoadSettings) -> dict:
    return {
        "model": str(target.path), "model_name": target.name, "draft": str(draft.path) if draft else None,
        "backend": target.backend, "threads": load.resolved_threads(), "n_ctx": target.n_ctx,
        "n_seq_max": load.n_seq_max, "llama_cpp_python": llama_cpp.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.machine(), "platform": platform.platform(),
    }


# --- command line -------------------------------------------------------------------------------
def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.lab", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF path, or 'embedded' (needed unless --engine-url)")
    ap.add_argument("--engine-url", action="append", default=[], metavar="[NAME=]URL",
                    help="a running OpenAI-compatible server instead of a model here (repeatable; e.g. "
                    "none=http://gpu:8000 ngram=http://gpu:8001); --concurrency then counts clients, up to 1024")
    ap.add_argument("--api-key-env", metavar="NAME", help="with --engine-url: the variable holding the API key")
    ap.add_argument("--draft", help="draft GGUF path, or 'embedded' (for the draft and auto methods)")
    ap.add_argument("--methods", default="none,lookup", help="comma-separated: none, lookup, draft, auto")
    ap.add_argument("--concurrency", type=_int_list, default=(1, 2, 4, 8), help="levels, e.g. 1,2,4,8")
    ap.add_argument("--prompts", required=True, help="JSON lines of {\"id\", \"prompt\"}")
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--out", required=True, help="a folder for results.json, plot.png and summary.md")
    ap.add_argument("--max-draft", type=int, default=8, help="most draft tokens per sequence per step")
    ap.add_argument("--no-adaptive", action="store_true",
                    help="always draft --max-draft tokens (measures speculation itself, not the cost model)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per cell, methods alternating; the fastest is kept (for a busy machine)")
    ap.add_argument("--stop-at-eos", action="store_true", help="end a request at its end token (default: "
                    "every request decodes --max-tokens, so every method does the same work)")
    ap.add_argument("--chat", action="store_true", help="each prompt as one user message in the chat template")
    args = ap.parse_args(argv)
    if bool(args.model) == bool(args.engine_url):
        ap.error("give --model (a model here) or --engine-url (running servers), not both")
    return args


def remote_config(args: argparse.Namespace):
    """The experiment against running servers (engine/measure/remote_lab.py), one API key for all of them."""
    from ..remote.keys import key_from_env
    from .remote_lab import RemoteLabConfig, parse_servers

    servers, key = parse_servers(args.engine_url), key_from_env(args.api_key_env)
    return RemoteLabConfig(prompts=args.prompts, servers=servers, concurrency=args.concurrency,
                           max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                           ignore_eos=not args.stop_at_eos, repeats=args.repeats,
                           api_keys={url: key for url in servers.values()} if key else {})


def config_from_args(args: argparse.Namespace) -> LabConfig:
    return LabConfig(prompts=args.prompts, model=args.model, draft=args.draft,
                     methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
                     concurrency=args.concurrency, max_tokens=args.max_tokens, max_draft=args.max_draft,
                     adaptive=not args.no_adaptive, temperature=args.temperature, seed=args.seed,
                     threads=args.threads, n_gpu_layers=args.gpu_layers, ignore_eos=not args.stop_at_eos,
                     repeats=args.repeats, chat=args.chat)


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
        line = (f"[{p.cell}/{p.cells}] {p.method:>6} × {p.concurrency:<2} {100 * p.fraction:5.1f}% overall  "
                f"{p.generated}/{p.expected} tokens  {p.elapsed_s:5.1f} s")
        self.stream.write(("\r" + line) if self.live else line + "\n")
        self.stream.flush()

    def cell_done(self, cell: dict) -> None:
        rate, full = cell["aggregate_tokens_per_s"], cell.get("full_tokens_per_s")
        acc = cell["acceptance_rate"]
        itl = cell["itl_p50_ms"]
        line = (f"{cell['method']:>6} × {cell['concurrency']:<2} {'n/a' if full is None else f'{full:.1f}':>7} tok/s "
                f"at full load, {rate or 0.0:.1f} aggregate, ITL p50 "
                f"{'n/a' if itl is None else f'{itl:.1f}'} ms, acceptance {'n/a' if acc is None else f'{acc:.0%}'}")
        self.stream.write(("\r" + line + " " * 20 + "\n") if self.live else line + "\n")
        self.stream.flush()


def main(argv: list[str] | None = None) -> int:
    from ..errors import GenerationCancelled
    from .lab_report import summary_markdown, with_analysis, write_plot

    from .remote_lab import run_remote_lab

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
