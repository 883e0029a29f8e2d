"""`python -m engine.measure.versus_server`: SpecChat beside llama.cpp's own server, paired prompt by prompt.

python -m engine.measure.versus_server --server PATH/llama-server --model PATH|embedded|embedded-gemma
    --prompts FILE.jsonl [--rounds 3] [--max-tokens 200] [--threads 2] [--out FILE.json]
    [--draft PATH [--chat]] [--temperature 0.7 --seed 1]

With --draft (a pair) the methods are instead: llama-server plain, --spec-type draft-simple (-md PATH), and
draft-simple,ngram-simple; SpecChat plain, lookup, draft and auto. --chat sends each prompt as one user message
in the model's chat template (llama-server gets the same rendered text, its special tokens parsed).

For every prompt and round it runs, back to back (the order rotated each time, so a slow spell of a
shared machine falls on every method alike): llama-server plain, llama-server --spec-type ngram-simple,
the same with SpecChat's cache settings (--swa-full --kv-unified), SpecChat plain and SpecChat lookup.
Greedy (or sampled alike on both sides: --temperature, --seed), end tokens ignored, raw completion, the prompt
never cached. Reported per method: the median over prompts of each prompt's fastest run, and the paired ratio
(the median over prompts and rounds of runs made back to back); then one row per prompt kind (a prompt file's
"kind": "repeating" or "open"), as the README gives them, with the prompt where lookup did worst against SpecChat
plain.

Why the third server: greedy answers part where the model's top two tokens nearly tie, and where they
part depends on numerics that the cache layout changes. With its defaults llama-server writes other
answers than SpecChat to some prompts (Gemma 3 270M: 3 of 6 of our tuning prompts, one from its second
token), and a copying answer that parted copies more or less, so its speed is another answer's. With
SpecChat's cache settings it writes SpecChat's answers, so lookup and ngram-simple draft on the same text.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..chat_format import ChatFormatter
from ..decoding.loader import DecoderSettings, build_decoder
from ..decoding.runtime import Model, model_params
from ..decoding.sampling import SamplingParams
from ..lab.bench import GREEDY, answer_tokens, encode, llama_cpp_sampling, read_prompts
from ..modelfiles.embedded import resolve_model

SERVER_METHODS = {
    "server plain": [],
    "server ngram-simple": ["--spec-type", "ngram-simple"],
    "server ngram-simple, SpecChat's cache": ["--spec-type", "ngram-simple", "--swa-full", "--kv-unified"],
}
PLAIN, LOOKUP = "SpecChat plain", "SpecChat lookup"
SPECCHAT_METHODS = {PLAIN: "none", LOOKUP: "lookup"}
SPECCHAT_PAIR_METHODS = {PLAIN: "none", LOOKUP: "lookup", "SpecChat draft": "draft", "SpecChat auto": "auto"}


def server_pair_methods(draft: str) -> dict[str, list[str]]:
    """llama-server with a draft model: -md alone drafts nothing, --spec-type draft-simple turns it on."""
    return {
        "server plain": [],
        "server draft-simple": ["-md", draft, "--spec-type", "draft-simple"],
        "server draft-simple,ngram-simple": ["-md", draft, "--spec-type", "draft-simple,ngram-simple"],
    }


STARTUP_S = 120
FLASH_ATTENTION = {"auto": None, "on": True, "off": False}  # --flash-attn, as llama-server spells it


def same_kernels(flash_attention: bool | None = None) -> list[str]:
    """llama-server's flags for SpecChat's kernels, as near as it has them, and with the flash attention SpecChat is
    given (None: both leave it to llama.cpp, runtime.flash_attention_type). On AMX CPUs llama-server's default load
    crashes on multi-row steps as SpecChat's did (runtime.model_params), and its only way out is --no-repack, which
    turns off the repacked CPU kernels too: SpecChat keeps those (repack.py), so there its verify steps of several
    rows are cheaper than the server's (Qwen2.5-Coder 1.5B Q4_K_M, 4 rows: 1.65 one-row steps against 2.57)."""
    flags = [] if model_params()[0].use_extra_bufts else ["--no-repack"]
    if flash_attention is not None:
        flags += ["--flash-attn", "on" if flash_attention else "off"]
    return flags


@dataclass
class Run:
    tokens_per_s: float
    tokens: list[int]


class LlamaServer:
    """One llama-server process on a free local port."""

    def __init__(
        self,
        binary: str,
        model: str,
        extra: list[str],
        threads: int,
        n_ctx: int = 4096,
        flash_attention: bool | None = None,
    ):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._proc = subprocess.Popen(
            [
                binary,
                "-m",
                model,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "-t",
                str(threads),
                "-c",
                str(n_ctx),
                "-np",
                "1",
                "--no-webui",
                *extra,
                *same_kernels(flash_attention),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + STARTUP_S
        while not self._healthy():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"llama-server {' '.join(extra)} did not start")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1).status == 200
        except OSError:
            return False

    def complete(self, prompt: str, max_tokens: int, sampling: SamplingParams = GREEDY) -> Run:
        reply = self.request(prompt, max_tokens, sampling)
        return Run(reply["timings"]["predicted_per_second"], reply["tokens"])

    def request(self, prompt: str, max_tokens: int, sampling: SamplingParams = GREEDY) -> dict:
        """One raw completion, end tokens ignored and the prompt never cached: the server's whole reply (its
        timings carry draft_n and draft_n_accepted)."""
        body = json.dumps(
            {
                "prompt": prompt,
                "n_predict": max_tokens,
                **llama_cpp_sampling(sampling),
                "ignore_eos": True,
                "cache_prompt": False,
                "return_tokens": True,
            }
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion", body, {"Content-Type": "application/json"}
        )
        reply: dict = json.loads(urllib.request.urlopen(request, timeout=600).read())
        return reply

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def specchat_runner(
    model: str,
    method: str,
    threads: int | None,
    flash_attention: bool | None = None,
    draft: str | None = None,
    chat: bool = False,
    sampling: SamplingParams = GREEDY,
) -> Callable[[str, int], Run]:
    """SpecChat's decoder for one method (calibrated first, as the chat is at load), as bench runs it."""
    decoder = build_decoder(
        DecoderSettings(
            model=model,
            method=method,
            threads=threads,
            remember_requests=False,
            flash_attention=flash_attention,
            draft=draft,
        )
    )
    decoder.calibrate()
    formatter = ChatFormatter(decoder.target) if chat else None

    def complete(prompt: str, max_tokens: int) -> Run:
        tokens, _ = encode(decoder.target, formatter, prompt)
        out = answer_tokens(decoder, tokens, max_tokens, sampling)
        return Run(decoder.stats.decode_tokens_per_s or 0.0, out)

    return complete


def rotations(methods: list[str], rounds: int, prompts: int) -> list[list[str]]:
    """The order of the methods for each (round, prompt): rotated by one each time."""
    return [
        methods[k % len(methods) :] + methods[: k % len(methods)] for r in range(rounds) for k in range(r, r + prompts)
    ]


def run_paired(
    runners: dict[str, Callable[[str, int], Run]],
    items: list[dict],
    rounds: int,
    max_tokens: int,
    report: Callable[[str], None] = print,
) -> dict[str, dict[str, list[Run]]]:
    """results[method][prompt id]: one Run per round."""
    results: dict[str, dict[str, list[Run]]] = {m: {str(i["id"]): [] for i in items} for m in runners}
    orders = iter(rotations(list(runners), rounds, len(items)))
    for r in range(rounds):
        for item in items:
            for method in next(orders):
                results[method][str(item["id"])].append(runners[method](item["prompt"], max_tokens))
            report(
                f"round {r + 1} {item['id']}: "
                + ", ".join(f"{m} {results[m][str(item['id'])][-1].tokens_per_s:.1f}" for m in runners)
            )
    return results


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def summarise(
    results: dict[str, dict[str, list[Run]]], kinds: dict[str, str | None] | None = None, base: str = PLAIN
) -> dict:
    """Per method: the median of each prompt's fastest run; per pair with `base` and with SpecChat lookup: the
    paired ratio; on how many prompts each method wrote `base`'s answer; and the prompt where lookup did worst
    against `base`. With prompt kinds ("repeating", "open") given, the same for each kind under "by_kind"."""
    ids = list(results[base])
    summary = _summary(results, ids, base)
    groups: dict[str | None, list[str]] = {}
    for i in ids:
        groups.setdefault((kinds or {}).get(i), []).append(i)
    if len(groups) > 1 or None not in groups:
        summary["by_kind"] = {
            kind or "unlabelled": _summary(results, members, base) for kind, members in groups.items()
        }
    return summary


def _summary(results: dict[str, dict[str, list[Run]]], ids: list[str], base: str) -> dict:
    def fastest(m: str, i: str) -> float:
        return max(r.tokens_per_s for r in results[m][i])

    def paired(a: str, b: str) -> float:
        return statistics.median(
            x.tokens_per_s / y.tokens_per_s for i in ids for x, y in zip(results[a][i], results[b][i])
        )

    best = {m: statistics.median(fastest(m, i) for i in ids) for m in results}
    same = {
        m: sum(first_difference(runs[i][0].tokens, results[base][i][0].tokens) is None for i in ids)
        for m, runs in results.items()
    }
    out = {
        "prompts": len(ids),
        "median_tokens_per_s": best,
        "same_answer_as_plain": same,
        "paired_vs_plain": {m: paired(m, base) for m in results if m != base},
        "plain_paired_vs": {m: paired(base, m) for m in results if m != base},
        "lookup_paired_vs": {},
    }
    if LOOKUP in results:
        out["lookup_paired_vs"] = {m: paired(LOOKUP, m) for m in results if m != LOOKUP}
        worst = min(ids, key=lambda i: fastest(LOOKUP, i) / fastest(base, i))
        out["lookup_worst_vs_plain"] = {"prompt": worst, "ratio": fastest(LOOKUP, worst) / fastest(base, worst)}
    return out


def table(summary: dict) -> str:
    lines = [
        "| method | median tok/s | × SpecChat plain (paired) | SpecChat lookup × it (paired) "
        "| answers as SpecChat plain |",
        "|---|---|---|---|---|",
    ]
    for m, rate in summary["median_tokens_per_s"].items():
        vs_plain = summary["paired_vs_plain"].get(m)
        vs_lookup = summary["lookup_paired_vs"].get(m)
        same = f"{summary['same_answer_as_plain'][m]}/{summary['prompts']}"
        lines.append(
            f"| {m} | {rate:.1f} | {f'{vs_plain:.2f}×' if vs_plain else '—'} | "
            f"{f'{vs_lookup:.2f}×' if vs_lookup else '—'} | {same} |"
        )
    return "\n".join(lines)


def kind_table(summary: dict) -> str:
    """The README's rows: one per prompt kind (or one for the set), every method's figure beside the others.
    Ratios of the medians, the paired ratio in brackets; lookup's worst prompt against SpecChat plain."""
    lines = [
        "| prompts | server plain | SpecChat plain | SpecChat lookup | plain × server plain | lookup × SpecChat "
        "plain (worst prompt) | lookup × ngram-simple | lookup × ngram-simple, same cache |",
        "|---|" + "---|" * 7,
    ]
    server, ngram, same_cache = SERVER_METHODS
    for kind, s in (summary.get("by_kind") or {"all": summary}).items():
        med, pvp, lpv = s["median_tokens_per_s"], s["paired_vs_plain"], s["lookup_paired_vs"]
        worst = s["lookup_worst_vs_plain"]
        lines.append(
            f"| {kind} ({s['prompts']}) | {med[server]:.1f} | {med[PLAIN]:.1f} | {med[LOOKUP]:.1f} | "
            f"{med[PLAIN] / med[server]:.2f}× ({s['plain_paired_vs'][server]:.2f}×) | "
            f"{med[LOOKUP] / med[PLAIN]:.2f}× ({pvp[LOOKUP]:.2f}×, {worst['prompt']} {worst['ratio']:.2f}×) | "
            f"{med[LOOKUP] / med[ngram]:.2f}× ({lpv[ngram]:.2f}×) | "
            f"{med[LOOKUP] / med[same_cache]:.2f}× ({lpv[same_cache]:.2f}×) |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.measure.versus_server", description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="the llama-server binary")
    ap.add_argument("--model", required=True, help="a GGUF path, 'embedded' or 'embedded-gemma'")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--flash-attn",
        choices=FLASH_ATTENTION,
        default="auto",
        help="flash attention for both sides (default: llama.cpp's choice)",
    )
    ap.add_argument("--draft", help="a draft GGUF: compare the pair's methods (see above)")
    ap.add_argument("--chat", action="store_true", help="each prompt as one user message in the chat template")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy; else sampled on both sides with SpecChat's default top-k, top-p and min-p, and --seed",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out")
    return ap.parse_args(argv)


def _served_by(server: LlamaServer, rendered: dict[str, str], sampling: SamplingParams) -> Callable[[str, int], Run]:
    """A runner that asks this server for each prompt as rendered."""
    return lambda prompt, n: server.complete(rendered[prompt], n, sampling)


def server_prompts(model_path: str, items: list[dict], chat: bool) -> dict[str, str]:
    """Each prompt as the server is sent it: the text itself, or (chat) as SpecChat's runners decode it."""
    if not chat:
        return {i["prompt"]: i["prompt"] for i in items}
    with Model(Path(model_path), vocab_only=True) as vocab:
        formatter = ChatFormatter(vocab)
        return {i["prompt"]: formatter.render([{"role": "user", "content": i["prompt"]}])[0] for i in items}


def print_summary(summary: dict, pair: bool) -> None:
    print(table(summary))
    if not pair:
        print()
        print(kind_table(summary))
    else:
        for kind, s in (summary.get("by_kind") or {}).items():
            print(f"\n{kind}:\n{table(s)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed) if args.temperature else GREEDY
    items = read_prompts(args.prompts)
    flash = FLASH_ATTENTION[args.flash_attn]
    ours = SPECCHAT_PAIR_METHODS if args.draft else SPECCHAT_METHODS
    runners = {
        m: specchat_runner(args.model, method, args.threads, flash, args.draft, args.chat, sampling)
        for m, method in ours.items()
    }
    model_path = str(resolve_model(args.model))  # 'embedded' or 'embedded-gemma' too
    rendered = server_prompts(model_path, items, args.chat)
    servers: dict[str, LlamaServer] = {}
    try:
        for m, extra in (server_pair_methods(args.draft) if args.draft else SERVER_METHODS).items():
            servers[m] = LlamaServer(args.server, model_path, extra, args.threads, flash_attention=flash)
        served = {m: _served_by(s, rendered, sampling) for m, s in servers.items()}
        runs = run_paired({**served, **runners}, items, args.rounds, args.max_tokens)
    finally:
        for s in servers.values():
            s.close()
    summary = summarise(runs, {str(i["id"]): i["kind"] for i in items})
    print_summary(summary, bool(args.draft))
    if args.out:
        per_prompt = {
            m: {i: [{"tokens_per_s": r.tokens_per_s, "tokens": r.tokens} for r in rs] for i, rs in per.items()}
            for m, per in runs.items()
        }
        Path(args.out).write_text(json.dumps({"summary": summary, "runs": per_prompt}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
