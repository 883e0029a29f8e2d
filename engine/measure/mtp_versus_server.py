"""`python -m engine.measure.mtp_versus_server`: SpecChat's `--method mtp` beside llama-server's `--spec-type draft-mtp`,
drafted and kept tokens counted on the same prompts (issue 65 item 7).

python -m engine.measure.mtp_versus_server --server PATH/llama-server [--model PATH ...] [--synthetic DIR]
    [--prompts FILE.jsonl] [--max-tokens 64] [--draft 3] [--threads 2] [--out FILE.json]

Both sides draft by the same rule: greedy, `--draft` tokens at every step that has room for them (SpecChat with fixed
lengths, as the lab's --no-adaptive: no cost model; llama-server --spec-draft-n-max N --spec-draft-n-min 0), no
confidence cutoff (p_min 0 on both: llama-server's default; SpecChat's own default, 0.75, would end drafts early),
end tokens ignored, raw completions, the prompt never cached, the server with SpecChat's cache settings
(--swa-full --kv-unified). Without --model it runs the synthetic MTP files (engine/measure/synthetic.py, written into
--synthetic or a temporary folder). Per model: both sides' drafted and kept tokens over the prompts, how far apart
(relative to llama-server's), and on how many prompts the two wrote the same answer.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..decoding.loader import DecoderSettings, build_decoder
from ..lab.bench import GREEDY, answer_tokens, read_prompts
from . import synthetic
from .versus_server import LlamaServer

PROMPTS = ("Hello there, how are you?", "The quick brown fox jumps over the lazy dog.", "Once upon a time, in")
TOLERANCE = 0.05  # the bar: the two counts within 5%


@dataclass
class Counts:
    drafted: int = 0
    accepted: int = 0
    same_answers: int = 0  # prompts where this side wrote the other's answer


def server_flags(draft: int) -> list[str]:
    return [
        *("--spec-type", "draft-mtp", "--spec-draft-n-max", str(draft), "--spec-draft-n-min", "0"),
        *("--spec-draft-p-min", "0", "--swa-full", "--kv-unified"),
    ]


def compare(server_binary: str, model: str, prompts: list[str], max_tokens: int, draft: int, threads: int) -> dict:
    """Both sides' counts on one model, summed over the prompts."""
    settings = DecoderSettings(
        model=model, method="mtp", threads=threads, remember_requests=False, adaptive=False, max_draft=draft, p_min=0.0
    )
    decoder = build_decoder(settings)
    server = None
    try:
        server = LlamaServer(server_binary, model, server_flags(draft), threads)
        ours, theirs = Counts(), Counts()
        for prompt in prompts:
            answer = answer_tokens(decoder, decoder.target.tokenize(prompt), max_tokens, GREEDY)
            ours.drafted, ours.accepted = ours.drafted + decoder.stats.drafted, ours.accepted + decoder.stats.accepted
            reply = server.request(prompt, max_tokens)
            timings = reply["timings"]
            theirs.drafted += timings.get("draft_n", 0)
            theirs.accepted += timings.get("draft_n_accepted", 0)
            same = answer == reply["tokens"]
            ours.same_answers += same
            theirs.same_answers += same
    finally:
        if server is not None:
            server.close()
        decoder.target.close()
    return {"model": model, "prompts": len(prompts), "specchat": asdict(ours), "llama_server": asdict(theirs)}


def apart(ours: int, theirs: int) -> float:
    """How far SpecChat's count is from llama-server's, relative to llama-server's (0 when both are 0)."""
    return abs(ours - theirs) / theirs if theirs else float(ours != 0)


def table(rows: list[dict]) -> str:
    lines = [
        "| model | prompts | SpecChat drafted / kept | llama-server drafted / kept | drafted apart | kept apart "
        "| same answers |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours, theirs = r["specchat"], r["llama_server"]
        lines.append(
            f"| {Path(r['model']).name} | {r['prompts']} | {ours['drafted']} / {ours['accepted']} | "
            f"{theirs['drafted']} / {theirs['accepted']} | {apart(ours['drafted'], theirs['drafted']):.1%} | "
            f"{apart(ours['accepted'], theirs['accepted']):.1%} | {ours['same_answers']}/{r['prompts']} |"
        )
    return "\n".join(lines)


def within_tolerance(rows: list[dict]) -> bool:
    return all(
        apart(r["specchat"][k], r["llama_server"][k]) <= TOLERANCE for r in rows for k in ("drafted", "accepted")
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.measure.mtp_versus_server", description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="the llama-server binary")
    ap.add_argument(
        "--model", action="append", help="a GGUF with MTP layers (repeatable); default: the synthetic files"
    )
    ap.add_argument("--synthetic", type=Path, help="where to write the synthetic files (default: a temporary folder)")
    ap.add_argument("--prompts", help="a prompts .jsonl (default: three short built-in prompts)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--draft", type=int, default=3, help="drafts a step on both sides (llama-server's default: 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the rows as JSON here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prompts = [str(i["prompt"]) for i in read_prompts(args.prompts)] if args.prompts else list(PROMPTS)
    with tempfile.TemporaryDirectory() as scratch:
        models = args.model or [
            str(p) for p in synthetic.write_all(args.synthetic or Path(scratch), synthetic.MTP_FILES).values()
        ]
        rows = [compare(args.server, m, prompts, args.max_tokens, args.draft, args.threads) for m in models]
    print(table(rows))
    ok = within_tolerance(rows)
    print(f"\nall counts within {TOLERANCE:.0%} of llama-server's: {'yes' if ok else 'no'}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
