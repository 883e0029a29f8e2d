"""Benchmark one decoding method on a set of prompts (raw completion, no chat template).

python -m engine.bench --model PATH|embedded [--draft PATH|embedded] --method none|lookup|draft
    [--max-draft K] [--temperature T] [--seed S] --max-tokens N [--ignore-eos] [--threads N]
    --prompts FILE.jsonl --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import llama_cpp
import torch

from .errors import EngineError
from .loader import METHODS, DecoderSettings, build_decoder
from .sampling import SamplingParams


def read_prompts(path: str | Path) -> list[dict]:
    prompts = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            item = json.loads(line)
            if "prompt" not in item:
                raise EngineError(f"{path}:{n}: each line needs a \"prompt\"")
            prompts.append({"id": item.get("id", n), "prompt": item["prompt"]})
    return prompts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a GGUF path, or 'embedded'")
    ap.add_argument("--draft", help="draft GGUF path, or 'embedded' (for --method draft)")
    ap.add_argument("--method", choices=METHODS, required=True)
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("--no-adaptive", action="store_true", help="always draft --max-draft tokens")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    settings = DecoderSettings(model=args.model, draft=args.draft, method=args.method, max_draft=args.max_draft,
                               adaptive=not args.no_adaptive, threads=args.threads, n_ctx=args.ctx)
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    prompts = read_prompts(args.prompts)
    decoder = build_decoder(settings)
    target = decoder.target
    for _ in decoder.generate(target.tokenize("Warm-up."), sampling, max_tokens=8):
        pass
    runs = []
    for item in prompts:
        tokens = target.tokenize(item["prompt"])
        out: list[int] = []
        text = []
        for delta in decoder.generate(tokens, sampling, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos):
            out += delta.tokens
            text.append(delta.text)
        s = decoder.stats
        runs.append({
            "id": item["id"], "method": args.method, "text": "".join(text), "tokens": out,
            "decode_tokens_per_s": s.decode_tokens_per_s, "ttft_s": s.ttft_s, "drafted": s.drafted,
            "accepted": s.accepted, "acceptance_rate": s.acceptance_rate,
            "mean_acceptance_length": s.mean_acceptance_length, "verify_steps": s.verify_steps,
        })
        print(f"{item['id']}: {len(out)} tokens, {s.decode_tokens_per_s or 0:.1f} tok/s, "
              f"acceptance {s.acceptance_rate if s.acceptance_rate is not None else 'n/a'}", file=sys.stderr)
    env = {
        "model": str(target.path), "draft": args.draft, "backend": target.backend,
        "threads": settings.load_settings().resolved_threads(), "n_ctx": target.n_ctx,
        "llama_cpp_python": llama_cpp.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.machine(), "temperature": args.temperature,
        "seed": args.seed, "max_draft": args.max_draft, "adaptive": not args.no_adaptive,
    }
    target.close()
    return {"runs": runs, "env": env}


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
