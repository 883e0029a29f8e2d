"""`python -m engine.measure.drafter_check`: the built-in drafters on this machine's backend, every layer offloaded
(packaging/gpu_check.sh's drafter section, issue 65 item 8). Greedy `--method mtp` beside `--method none` on the
synthetic MTP files (engine/measure/synthetic.py) and, where given, on a real model with MTP layers, or an EAGLE-3
pair (target and head, drafted as `--method draft --draft HEAD`).

python -m engine.measure.drafter_check --out FILE.json [--synthetic DIR] [--model PATH ...]
    [--pair TARGET HEAD] [--max-tokens 64] [--draft 3] [--n-gpu-layers -1] [--threads N] [--require-gpu]

Drafts are of a fixed length, with no confidence cutoff (as mtp_versus_server; on the tiny files the planner rightly
declines to draft, and its counts would say nothing), so the counts say what the head proposes and the target keeps. Each target's row: the
backend and the layers on the GPU, whether the two answers are the same token for token (the first difference where
not), drafted and kept tokens. The synthetic files must also keep what they are built to: every draft of
mtp-agreeing, almost none of mtp-random, some of mtp-half and mtp-half-context (whose rejections roll its recurrent
state back). With --require-gpu a row holds only with every layer on the GPU. Exit status 0 only when every row holds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from ..decoding.loader import DecoderSettings, build_decoder
from ..lab.bench import GREEDY, answer_tokens
from . import synthetic

PROMPT = "Hello there, how are you?"
# kept / drafted that each synthetic file is built to give (mtp-half: 0.29 expected with drafts of 3)
EXPECTED = {
    "mtp-agreeing": (1.0, 1.0),
    "mtp-random": (0.0, 0.05),
    "mtp-half": (0.2, 0.4),
    "mtp-half-context": (0.05, 0.5),
}


def answer(settings: DecoderSettings, max_tokens: int) -> tuple[list[int], dict]:
    """The greedy answer to PROMPT, its draft counts, and where the target's layers went."""
    decoder = build_decoder(settings)
    try:
        tokens = answer_tokens(decoder, decoder.target.tokenize(PROMPT), max_tokens, GREEDY)
        target = decoder.target
        facts = {
            "backend": target.backend,
            "layers_on_gpu": target.placement.get("layers_on_gpu"),
            "layers": target.placement.get("layers"),
            "all_layers_offloaded": target.placement.get("all_layers_offloaded"),
            "drafted": decoder.stats.drafted,
            "accepted": decoder.stats.accepted,
        }
        return tokens, facts
    finally:
        decoder.target.close()


def check(name: str, model: str, method: str, head: str | None, args: argparse.Namespace) -> dict:
    """One target: plain beside drafted, and whether the row holds."""
    common = {"model": model, "threads": args.threads, "n_gpu_layers": args.n_gpu_layers, "remember_requests": False}
    row: dict = {"name": name, "method": method}
    try:
        plain, _ = answer(DecoderSettings(method="none", **common), args.max_tokens)
        drafted, facts = answer(
            DecoderSettings(method=method, draft=head, adaptive=False, max_draft=args.draft, p_min=0.0, **common),
            args.max_tokens,
        )
    except Exception as exc:  # a backend that cannot run the head: the report says so, the check fails
        return {**row, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    row.update(facts)
    row["identical"] = drafted == plain
    if not row["identical"]:
        row["first_difference"] = next((i for i, (a, b) in enumerate(zip(plain, drafted)) if a != b), len(plain))
    rate = facts["accepted"] / facts["drafted"] if facts["drafted"] else None
    row["acceptance"] = rate
    low, high = EXPECTED.get(name, (0.0, 1.0))
    row["ok"] = row["identical"] and facts["drafted"] > 0 and rate is not None and low <= rate <= high
    if args.require_gpu:
        row["ok"] = row["ok"] and facts["all_layers_offloaded"] is True
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.measure.drafter_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the report, JSON")
    ap.add_argument("--synthetic", type=Path, help="where to write the synthetic files (default: a temporary folder)")
    ap.add_argument("--model", action="append", default=[], help="a real GGUF with MTP layers (repeatable)")
    ap.add_argument("--pair", nargs=2, metavar=("TARGET", "HEAD"), help="a real target and its EAGLE-3 head")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--draft", type=int, default=3, help="drafts a step (llama-server's draft-mtp default: 3)")
    ap.add_argument("--n-gpu-layers", type=int, default=-1, help="-1: every layer on the GPU (default)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--require-gpu", action="store_true", help="a row holds only with every layer on the GPU")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        files = synthetic.write_all(args.synthetic or Path(scratch), synthetic.MTP_FILES)
        rows = [check(name, str(path), "mtp", None, args) for name, path in files.items()]
    rows += [check(Path(m).name, m, "mtp", None, args) for m in args.model]
    if args.pair:
        target, head = args.pair
        rows.append(check(f"{Path(target).name} + {Path(head).name}", target, "draft", head, args))
    Path(args.out).write_text(json.dumps({"prompt": PROMPT, "max_tokens": args.max_tokens, "rows": rows}, indent=1))
    for r in rows:
        counts = f"{r['accepted']}/{r['drafted']} kept" if "drafted" in r else r.get("error", "")
        print(
            f"{'ok  ' if r['ok'] else 'FAIL'} {r['name']:24} {r.get('backend', '?'):6} identical={r.get('identical')} {counts}"
        )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
