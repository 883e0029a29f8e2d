"""Side-by-side speed check on one machine, interleaved per prompt so drift hits all methods alike.

python -m engine.measure.bench_compare --model embedded --prompts resources/prompts/grounded.jsonl --max-tokens 200 [--ignore-eos]

Methods: llama-cpp-python's own create_completion (the reference, first; --no-reference leaves it out), and
this engine's none / lookup (/ draft / auto with --draft), in an order rotated from one prompt run to the next
with plain decoding (none) run before, after and between the others, each compared with the plain runs beside it,
all greedy (or all sampled: --temperature; --seeds runs every prompt once per seed) on the same prompt tokens
(--chat: each prompt as one user message through the model's chat template); --methods picks some of them. Both sides count sampled tokens (not stream chunks, which can merge tokens)
and follow one end-token rule: both stop at the first end token, or with --ignore-eos both go on to
--max-tokens. Prints what was compared, decode tokens/s per prompt and the median ratio against each baseline,
and per kind of prompt the geometric mean over prompts of each one's median ratio to plain decoding (the figure
the benchmarks report: one prompt's runs at several seeds differ by 20% and more, its median much less).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import replace

import llama_cpp.llama
import numpy as np
from llama_cpp import Llama, LogitsProcessorList, StoppingCriteriaList

from ..chat_format import ChatFormatter
from ..decoding.loader import DecoderSettings, build_decoder
from ..decoding.runtime import model_params
from ..decoding.sampling import SamplingParams
from ..lab.bench import GREEDY, encode, llama_cpp_sampling, parse_seeds, read_prompts
from ..modelfiles.embedded import resolve_model
from ..modelfiles.model_check import check_model_file

REFERENCE = "llama-cpp-python"


def reference_run(
    llm: Llama, prompt: list[int], max_tokens: int, end_tokens: list[int] | None, sampling: SamplingParams = GREEDY
) -> tuple[float, dict]:
    """create_completion's decode speed, counted as llama.cpp's server does (after the first token).
    end_tokens: masked so that it goes on past them (it has no ignore-EOS switch); None: it stops at them."""
    sampled_at: list[float] = []

    def note_token(_ids, _logits) -> bool:  # called once per sampled token (and once more at the end)
        sampled_at.append(time.perf_counter())
        return False

    def mask_end_tokens(_ids, logits: np.ndarray) -> np.ndarray:
        logits[end_tokens] = -np.inf
        return logits

    out = llm.create_completion(
        prompt,
        max_tokens=max_tokens,
        **llama_cpp_sampling(sampling),
        stopping_criteria=StoppingCriteriaList([note_token]),
        logits_processor=LogitsProcessorList([mask_end_tokens]) if end_tokens else None,
    )
    assert isinstance(out, dict)  # not streamed: one response
    n = out["usage"]["completion_tokens"]  # tokens it kept: an end token that stopped it is not one
    times = sampled_at[:n]
    rate = (n - 1) / (times[-1] - times[0]) if n > 1 and times[-1] > times[0] else 0.0
    return rate, {"generated": n, "finish_reason": out["choices"][0]["finish_reason"]}


def engine_rate(
    decoder, prompt: list[int], max_tokens: int, ignore_eos: bool, sampling: SamplingParams = GREEDY
) -> tuple[float, dict]:
    out = [
        tok
        for delta in decoder.generate(prompt, sampling, max_tokens=max_tokens, ignore_eos=ignore_eos)
        for tok in delta.tokens
    ]
    s = decoder.stats
    return s.decode_tokens_per_s or 0.0, {
        "generated": s.generated,
        "finish_reason": s.finish_reason,
        "acceptance": s.acceptance_rate,
        "mean_len": s.mean_acceptance_length,
        "speedup_vs_plain": s.speedup_vs_plain,
        "guard": s.guard,
        "tokens": out,
    }


def method_settings(method: str) -> tuple[str, bool]:
    """'auto+exact' -> ('auto', True): a method, and whether it runs as exact greedy."""
    base, _, exact = method.partition("+")
    return base, exact == "exact"


def rotated(methods: list[str], turn: int) -> list[str]:
    """The methods' order for one prompt run, rotated by one each time: in a fixed order the method that always
    ran third read 0.97x the first on the same plain decode (16 runs); alternated, 1.00x."""
    k = turn % len(methods)
    return methods[k:] + methods[:k]


def bracketed(methods: list[str], turn: int) -> list[str]:
    """One prompt run's order: plain decoding first, last and between every other method (theirs rotated by one
    each run), so that each method is compared with the plain runs on either side of it. This VM's speed wanders
    over seconds: plain decoding alone read 24.6 and 32.7 tok/s on one prompt in two rounds, and a method two runs
    away from its plain run read 0.86-0.97x plain in three rounds of a prompt where it drafted almost nothing."""
    order = ["none"]
    for method in rotated([m for m in methods if m != "none"], turn):
        order += [method, "none"]
    return order


def plain_beside(row: dict, method: str) -> float:
    """The plain decoding rate measured beside `method` in this prompt run: the geometric mean of the plain runs
    just before and after it (a row from before bracketing: its one plain run)."""
    return row.get("plain_beside", {}).get(method) or row["none"]


def median_ratio(rows: list[dict], method: str, baseline: str) -> float | None:
    """Median of method / baseline over the prompt runs where the baseline decoded (≥ 2 tokens); against plain
    decoding, the plain runs beside the method's."""

    def base(r: dict) -> float:
        return plain_beside(r, method) if baseline == "none" else r[baseline]

    ratios = [r[method] / base(r) for r in rows if r[baseline] > 0 and base(r) > 0]
    return statistics.median(ratios) if ratios else None


def by_kind(rows: list[dict], kinds: dict[str, str], methods: list[str]) -> dict[str, dict[str, float]]:
    """Per kind of prompt and method: the geomean over prompts of each prompt's median ratio to plain decoding."""
    out: dict[str, dict[str, float]] = {}
    for kind in sorted(set(kinds.values())):
        ids = [i for i, k in kinds.items() if k == kind]
        for m in methods:
            medians = [median_ratio([r for r in rows if r["id"] == i], m, "none") for i in ids]
            ratios = [x for x in medians if x]
            if ratios:
                out.setdefault(kind, {})[m] = statistics.geometric_mean(ratios)
    return out


def what_was_compared(
    methods: list[str],
    max_tokens: int,
    ignore_eos: bool,
    sampling: SamplingParams = GREEDY,
    seeds: list[int] | None = None,
    reference: bool = True,
) -> str:
    """The line that says what was measured; without the reference it names SpecChat's loop alone."""
    if reference:
        sides = f"llama-cpp-python's create_completion (not streamed) and SpecChat's loop ({', '.join(methods)})"
        eos = (
            "end tokens ignored on both sides (create_completion's are masked by a logits processor, its only "
            "way to go on past them)"
            if ignore_eos
            else "both stop at the first end token"
        )
    else:
        sides = f"SpecChat's loop ({', '.join(methods)})"
        eos = "end tokens ignored" if ignore_eos else "each stops at the first end token"
    return (
        f"Compared: {sides}, {describe(sampling, seeds)}, the same prompt tokens, up to {max_tokens} tokens; "
        f"tokens counted as sampled, decode tokens/s = (tokens - 1) / time from the first token to the last; "
        f"{eos}."
    )


def describe(sampling: SamplingParams, seeds: list[int] | None = None) -> str:
    if sampling.greedy:
        return "greedy"
    seeded = f"seeds {', '.join(map(str, seeds))}" if seeds and len(seeds) > 1 else f"seed {sampling.seed}"
    return (
        f"sampled at temperature {sampling.temperature} (top-k {sampling.top_k}, top-p {sampling.top_p}, "
        f"min-p {sampling.min_p}, {seeded})"
    )


@contextmanager
def safe_model_params():
    """Llama() loads with llama.cpp's default model parameters; while this holds, it gets SpecChat's, less the
    repacking by name (no layout that crashes: runtime.model_params)."""
    lowlevel = llama_cpp.llama.llama_cpp
    default = lowlevel.llama_model_default_params
    lowlevel.llama_model_default_params = lambda: model_params()[0]
    try:
        yield
    finally:
        lowlevel.llama_model_default_params = default


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.measure.bench_compare")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--draft")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--chat", action="store_true", help="each prompt as one user message in the chat template")
    ap.add_argument("--no-reference", action="store_true", help="leave llama-cpp-python's create_completion out")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy; else sampled (SpecChat's default top-k, top-p and min-p), every side with --seed",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--seeds",
        type=parse_seeds,
        help="with --temperature: run every prompt once per seed, "
        "as 1-8 or 1,2,5 (the ratios per kind are medians over them)",
    )
    ap.add_argument("--methods", help="some of none,lookup,draft,auto (draft and auto need --draft); none always runs")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    args.seeds = args.seeds or [args.seed]
    if len(args.seeds) > 1 and not args.temperature:
        ap.error("--seeds needs --temperature: greedy answers do not depend on a seed")
    available = ["none", "lookup"] + (["draft", "auto"] if args.draft else [])
    args.methods = ["none", *(m for m in args.methods.split(",") if m != "none")] if args.methods else available
    unknown = [m for m in args.methods if method_settings(m)[0] not in available]
    if unknown:
        ap.error(f"--methods: {', '.join(unknown)} not available here (draft and auto need --draft)")
    return args


def warmed_decoders(args: argparse.Namespace) -> dict:
    """A calibrated, warmed-up decoder per method, as the chat's is at load: no answer pays for timing the step
    sizes, nor for the first decodes after a load, which run slow. Lookup searches the prompt and the answer so far,
    not earlier answers: a repeat would copy its last run."""
    decoders = {
        m: build_decoder(
            DecoderSettings(
                model=args.model,
                draft=args.draft,
                method=method_settings(m)[0],
                threads=args.threads,
                max_draft=args.max_draft,
                remember_requests=False,
                exact=method_settings(m)[1],
            )
        )
        for m in args.methods
    }
    for decoder in decoders.values():
        decoder.calibrate()
        for _ in decoder.generate(decoder.target.tokenize("Warm-up."), GREEDY, max_tokens=8):
            pass
    return decoders


def prompt_run(
    args: argparse.Namespace,
    decoders: dict,
    llm: Llama | None,
    tokens: list[int],
    end_tokens: list[int] | None,
    sampling: SamplingParams,
    order: list[str],
) -> dict:
    """One prompt run: the reference, then the methods in `order` (plain decoding between them), as a row."""
    row: dict = {}
    if llm is not None:
        row[REFERENCE], row[REFERENCE + "_detail"] = reference_run(llm, tokens, args.max_tokens, end_tokens, sampling)
    runs = [engine_rate(decoders[m], tokens, args.max_tokens, args.ignore_eos, sampling) for m in order]
    plains = [rate for m, (rate, _) in zip(order, runs) if m == "none"]
    for i, m in enumerate(order):  # kept in one order, whichever ran first; plain: its first run
        if m not in row:
            row[m], row[m + "_detail"] = runs[i]
        if m != "none":
            row.setdefault("plain_beside", {})[m] = float(np.sqrt(runs[i - 1][0] * runs[i + 1][0]))
    row["plain_runs"] = plains
    return row


def print_ratios(rows: list[dict], kinds: dict[str, str], methods: list[str], reference: bool) -> tuple[dict, dict]:
    """The median ratios against each baseline and, per kind, against plain decoding: printed and returned."""
    ratios = {
        **({f"none / {REFERENCE}": median_ratio(rows, "none", REFERENCE)} if reference else {}),
        **{f"{m} / none": median_ratio(rows, m, "none") for m in methods[1:]},
    }
    for name, value in ratios.items():
        print(f"{name}: " + ("n/a" if value is None else f"{value:.2f}x") + f" (median over {len(rows)} prompt runs)")
    kind_ratios = by_kind(rows, kinds, methods[1:])
    for kind, per_method in kind_ratios.items():
        print(
            f"{kind}: "
            + ", ".join(f"{m} {v:.2f}x" for m, v in per_method.items())
            + " plain decoding (geomean over prompts of each one's median)"
        )
    return ratios, kind_ratios


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seeds, methods = args.seeds, args.methods
    sampling = SamplingParams(temperature=args.temperature, seed=seeds[0]) if args.temperature else GREEDY
    prompts = read_prompts(args.prompts)
    path = resolve_model(args.model)
    check_model_file(path)  # Llama() below loads it in this process, where a damaged file would abort it
    llm = None
    if not args.no_reference:
        with safe_model_params():
            llm = Llama(str(path), n_threads=args.threads, n_threads_batch=args.threads, n_ctx=4096, verbose=False)
    decoders = warmed_decoders(args)
    target = decoders["none"].target
    formatter = ChatFormatter(target) if args.chat else None
    end_tokens = [t for t in range(target.n_vocab) if target.is_end(t)] if args.ignore_eos else None
    compared = what_was_compared(methods, args.max_tokens, args.ignore_eos, sampling, seeds, llm is not None)
    print(compared)
    rows, kinds = [], {str(item["id"]): item.get("kind") or "all" for item in prompts}
    if len(seeds) > 1:  # a prompt's seeds one after another
        runs_of = [(item, seed) for item in prompts for _ in range(args.repeats) for seed in seeds]
    else:  # round by round through the prompts
        runs_of = [(item, seeds[0]) for _ in range(args.repeats) for item in prompts]
    for turn, (item, seed) in enumerate(runs_of):
        if not sampling.greedy:
            sampling = replace(sampling, seed=seed)
        tokens, _ = encode(target, formatter, item["prompt"])  # once, so every side decodes the same prompt
        # Rotated by the round as well: with as many prompts as methods to rotate (or a multiple), each prompt ran in
        # the same order every round (SmolLM2's open-garden read 0.90x with lookup+exact, always fourth, in 3 of 3)
        order = bracketed(methods, turn + turn // len(prompts))
        row = {"id": str(item["id"]), **({"seed": seed} if not sampling.greedy else {})}
        row |= prompt_run(args, decoders, llm, tokens, end_tokens, sampling, order)
        rows.append(row)
        shown = {k: v for k, v in row.items() if not k.endswith("_detail") and k != "plain_beside"}
        print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in shown.items()}), file=sys.stderr)
    ratios, kind_ratios = print_ratios(rows, kinds, methods, llm is not None)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"compared": compared, "rows": rows, "ratios": ratios, "by_kind": kind_ratios, "kinds": kinds},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
