"""Benchmark one decoding method on a set of prompts (raw completion, or --chat: the model's chat template).

python -m engine.bench --model PATH|embedded [--draft PATH|embedded] --method none|lookup|draft|auto|mtp
    [--max-draft K] [--no-adaptive] [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]
    --max-tokens N [--ignore-eos] [--chat] [--repeats R] [--threads N] --prompts FILE.jsonl --out FILE.json

--chat sends each prompt as one user message through the model's chat template (its stop strings
end an answer). --repeats R runs the whole prompt set R times (so outside load falls on every prompt
alike); "runs" keeps each prompt's run with the fastest decode, and its "every_run" all R of them.
A run whose prompt was still cached (a one-prompt set, repeated) skips prefill: its TTFT is not a
prompt's, and its reused_prompt_tokens says so.
One process runs one method: two bench runs compared side by side can fall in different speeds of a shared
machine. engine.measure.versus_server (beside llama-server) and the lab run methods back to back instead.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import llama_cpp
import torch

from .. import safe_files
from ..chat_format import ChatFormatter
from ..decoding.loader import DecoderSettings, build_decoder
from ..decoding.sampling import SamplingParams
from ..errors import EngineError, InvalidSettingError
from ..methods import DEFAULT_MAX_DRAFT, METHODS

GREEDY = SamplingParams(temperature=0.0)

MAX_REPEATS = 20
MAX_PROMPTS_BYTES = 64 << 20  # far beyond any prompt set the lab can run


def read_prompts(path: str | Path) -> list[dict]:
    try:  # only a regular file, and not past the limit (engine.safe_files): a FIFO or /dev/zero is refused
        text = safe_files.read_text(path, MAX_PROMPTS_BYTES)
    except safe_files.FileRefused as exc:
        raise EngineError(str(exc)) from exc
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            item = json.loads(line)
            if "prompt" not in item:
                raise EngineError(f'{path}:{n}: each line needs a "prompt"')
            # kind ("repeating": the answer repeats the prompt, or "open"): versus_server reports each apart
            prompts.append({"id": item.get("id", n), "prompt": item["prompt"], "kind": item.get("kind")})
    return prompts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a GGUF path, or 'embedded'")
    ap.add_argument("--draft", help="draft GGUF path, or 'embedded' (for --method draft or auto)")
    ap.add_argument("--method", choices=METHODS, required=True)
    ap.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    ap.add_argument("--no-adaptive", action="store_true", help="always draft --max-draft tokens")
    ap.add_argument(
        "--exact",
        action="store_true",
        help="exact greedy: verify only as many rows at once as this build decodes bit for bit like "
        "one-row steps, so greedy answers are plain decoding's token for token",
    )
    ap.add_argument(
        "--remember",
        action="store_true",
        help="lookup also searches the answers to earlier prompts of the run, as the chat does "
        "with earlier conversations (off by default: --repeats would copy its own answers)",
    )
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=SamplingParams.top_k, help="0 turns it off")
    ap.add_argument("--top-p", type=float, default=SamplingParams.top_p, help="1 turns it off")
    ap.add_argument("--min-p", type=float, default=SamplingParams.min_p, help="0 turns it off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument(
        "--ignore-eos",
        action="store_true",
        help="decode --max-tokens every time: neither end tokens nor --chat's stop strings end an answer",
    )
    ap.add_argument(
        "--chat", action="store_true", help="send each prompt as one user message through the model's chat template"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help=f"run the prompt set R times (1..{MAX_REPEATS}); the fastest run of each prompt is kept",
    )
    ap.add_argument("--threads", type=int)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise InvalidSettingError(f"repeats must be 1..{MAX_REPEATS}, got {args.repeats}")
    settings = DecoderSettings(
        model=args.model,
        draft=args.draft,
        method=args.method,
        max_draft=args.max_draft,
        adaptive=not args.no_adaptive,
        threads=args.threads,
        n_ctx=args.ctx,
        remember_requests=args.remember,
        exact=args.exact,
    )
    sampling = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed
    )
    prompts = read_prompts(args.prompts)
    decoder = build_decoder(settings)
    target = decoder.target
    try:
        formatter = ChatFormatter(target) if args.chat else None
        if formatter and formatter.template_error:
            print(f"warning: {formatter.template_error}", file=sys.stderr)
        encoded = [encode(target, formatter, item["prompt"]) for item in prompts]
        stop = () if args.ignore_eos else (encoded[0][1] if encoded else ())
        decoder.calibrate()
        for _ in decoder.generate(target.tokenize("Warm-up."), sampling, max_tokens=8):
            pass
        every_run: list[list[dict]] = [[] for _ in prompts]
        for repeat in range(args.repeats):  # the whole set each time: outside load falls on every prompt alike
            for item, (tokens, _), kept in zip(prompts, encoded, every_run):
                kept.append(one_run(decoder, item, tokens, sampling, args, stop, repeat))
        env = _environment(target, args, settings)
    finally:
        target.close()
    run_settings = _run_settings(args, decoder.loop.exact_rows, formatter, stop)
    return {"runs": [fastest(runs) for runs in every_run], "settings": run_settings, "env": env}


def _environment(target, args: argparse.Namespace, settings: DecoderSettings) -> dict:
    return {
        "model": str(target.path),
        "draft": args.draft,
        "backend": target.backend,
        "threads": settings.load_settings().resolved_threads(),
        "n_ctx": target.n_ctx,
        "llama_cpp_python": llama_cpp.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def _run_settings(
    args: argparse.Namespace, exact_rows: int | None, formatter: ChatFormatter | None, stop: tuple[str, ...]
) -> dict:
    return {
        "method": args.method,
        "max_tokens": args.max_tokens,
        "ignore_eos": args.ignore_eos,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "seed": args.seed,
        "max_draft": args.max_draft,
        "adaptive": not args.no_adaptive,
        "repeats": args.repeats,
        "exact": args.exact,
        "exact_rows": exact_rows,
        "chat": args.chat,
        "chat_template": (None if formatter is None else "model" if formatter.uses_template else "plain fallback"),
        "stop": list(stop),
        "prompts": str(args.prompts),
    }


def encode(target, formatter: ChatFormatter | None, text: str) -> tuple[list[int], tuple[str, ...]]:
    """Prompt tokens and stop strings: the raw text, or one user message through the chat template."""
    if formatter is None:
        return target.tokenize(text), ()
    _, tokens, stop = formatter.render([{"role": "user", "content": text}])
    return tokens, stop


def parse_seeds(text: str) -> list[int]:
    """ "1,2,5" or "1-8"."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def answer_tokens(decoder, tokens: list[int], max_tokens: int, sampling: SamplingParams = GREEDY) -> list[int]:
    """The tokens of an answer, end tokens ignored (as --ignore-eos): what replay records and versus_server
    compares."""
    return [
        t for delta in decoder.generate(tokens, sampling, max_tokens=max_tokens, ignore_eos=True) for t in delta.tokens
    ]


def llama_cpp_sampling(sampling: SamplingParams) -> dict:
    """The same sampling as llama.cpp's own parameters (create_completion's, llama-server's): greedy, or SpecChat's
    filters, which llama.cpp applies in the same order."""
    if sampling.greedy:
        return {"temperature": 0.0, "top_k": 1}
    return {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "seed": sampling.seed,
    }


def one_run(
    decoder,
    item: dict,
    tokens: list[int],
    sampling: SamplingParams,
    args: argparse.Namespace,
    stop: tuple[str, ...],
    repeat: int,
) -> dict:
    out: list[int] = []
    text = []
    for delta in decoder.generate(tokens, sampling, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos, stop=stop):
        out += delta.tokens
        text.append(delta.text)
    s = decoder.stats
    print(
        f"{item['id']} (run {repeat + 1}/{args.repeats}): {len(out)} tokens, {s.decode_tokens_per_s or 0:.1f} "
        f"tok/s, {s.drafted} drafted, {s.accepted} accepted, acceptance "
        f"{s.acceptance_rate if s.acceptance_rate is not None else 'n/a'}",
        file=sys.stderr,
    )
    return {
        "id": item["id"],
        "method": args.method,
        "repeat": repeat,
        "text": "".join(text),
        "tokens": out,
        "prompt_tokens": s.prompt_tokens,
        "reused_prompt_tokens": s.reused_prompt_tokens,
        "finish_reason": s.finish_reason,
        "decode_tokens_per_s": s.decode_tokens_per_s,
        "ttft_s": s.ttft_s,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance_rate": s.acceptance_rate,
        "mean_acceptance_length": s.mean_acceptance_length,
        "verify_steps": s.verify_steps,
        "speedup_vs_plain": s.speedup_vs_plain,
        "guard": s.guard,
        "by_proposer": s.by_proposer,
    }


def fastest(runs: list[dict]) -> dict:
    """Of one prompt's repeated runs, the fastest decode: other work on the machine only ever slows a
    run down (as engine.lab keeps its cells). Every run stays in "every_run", so the spread is visible."""
    best = dict(max(runs, key=lambda r: r["decode_tokens_per_s"] or 0.0))
    best["repeats"] = len(runs)
    best["every_run"] = runs
    return best


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except (EngineError, OSError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
