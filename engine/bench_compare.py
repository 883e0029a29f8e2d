"""Side-by-side speed check on one machine, interleaved per prompt so drift hits all methods alike.

python -m engine.bench_compare --model embedded --prompts resources/prompts/grounded.jsonl --max-tokens 200

Methods: llama-cpp-python's own create_completion (the reference), and this engine's none / lookup
(/ draft with --draft). Prints decode tokens/s per prompt and the median ratio against each baseline.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from llama_cpp import Llama

from .bench import read_prompts
from .embedded import resolve_model
from .loader import DecoderSettings, build_decoder
from .sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def reference_rate(llm: Llama, prompt: str, max_tokens: int) -> float:
    """create_completion's decode speed, counted as llama.cpp's server does (after the first token)."""
    first = last = None
    n = 0
    for _ in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_k=1, stream=True):
        last = time.perf_counter()
        first = first or last
        n += 1
    return (n - 1) / (last - first) if n > 1 else 0.0


def engine_rate(decoder, prompt: str, max_tokens: int, ignore_eos: bool) -> tuple[float, dict]:
    tokens = decoder.target.tokenize(prompt)
    for _ in decoder.generate(tokens, GREEDY, max_tokens=max_tokens, ignore_eos=ignore_eos):
        pass
    s = decoder.stats
    return s.decode_tokens_per_s or 0.0, {"generated": s.generated, "acceptance": s.acceptance_rate,
                                          "mean_len": s.mean_acceptance_length}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench_compare")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--draft")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    prompts = read_prompts(args.prompts)
    path = resolve_model(args.model)
    llm = Llama(str(path), n_threads=args.threads, n_threads_batch=args.threads, n_ctx=4096, verbose=False)
    methods = ["none", "lookup"] + (["draft"] if args.draft else [])
    decoders = {m: build_decoder(DecoderSettings(model=args.model, draft=args.draft, method=m, threads=args.threads,
                                                 max_draft=args.max_draft)) for m in methods}
    rows = []
    for _ in range(args.repeats):
        for item in prompts:
            row = {"id": item["id"], "llama-cpp-python": reference_rate(llm, item["prompt"], args.max_tokens)}
            for m, decoder in decoders.items():
                row[m], row[m + "_detail"] = engine_rate(decoder, item["prompt"], args.max_tokens, args.ignore_eos)
            rows.append(row)
            print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()
                              if not k.endswith("_detail")}), file=sys.stderr)
    ratios = {
        "none / llama-cpp-python": statistics.median(r["none"] / r["llama-cpp-python"] for r in rows),
        "lookup / none": statistics.median(r["lookup"] / r["none"] for r in rows),
    }
    if args.draft:
        ratios["draft / none"] = statistics.median(r["draft"] / r["none"] for r in rows)
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x (median over {len(rows)} prompt runs)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
