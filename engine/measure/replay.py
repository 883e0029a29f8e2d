"""`python -m engine.measure.replay`: the decoding methods' policies replayed offline on recorded answers.

Timing runs on a shared CPU vary by 5-10% between runs, more than most policy changes are worth, so a
policy cannot be tuned on them. `record` saves a model's plain answers to a prompt set (token ids; greedy, or
sampled with `--temperature` over `--seeds`) and its step-cost curve as decoding pays it (seconds by rows
verified; recording.py). A sampled
answer replays as faithfully as a greedy one: a seed fixes the token at each position whatever is drafted
(the verifier draws lookup's tokens by Gumbel noise keyed to the position), so which drafted tokens an answer
keeps is still which ones it goes on to write. `replay` then drives the real StepLoop,
DraftPlanner and LookupProposer over those answers on a virtual clock that charges each decode the
recorded curve, and sets the result beside two baselines on the same clock:
- llama.cpp's ngram-simple (`llama-server --spec-type ngram-simple`): after a 12-token match, up to 48
  tokens drafted, every step;
- the hindsight bound for these proposals: at every step the draft length that is best for the rest of
  the answer, knowing how many of each proposal's tokens the answer keeps (dynamic programming over the
  answer, longest-match proposals without learned edits). It bounds what choosing draft lengths can win;
- the any-copy bound: the same, with each step's draft copied from whichever earlier place in the history
  the answer follows furthest. It bounds what any prompt-lookup proposer can win on these step costs.
With `record --draft FILE` (greedy answers) the draft model's proposal at every position is recorded too, with
its own curve, and the draft and auto methods replay as well (engine.measure.draft_replay).
Each figure is a decode speed-up: plain decoding's time over the method's, per prompt. `replay --curves FILE
--shape NAME [--draft-shape NAME]` charges another device's curves instead (engine.measure.gpu_kit): a
prediction for that device. Deterministic,
about a second per prompt set; a replay does not see what the curve leaves out (numerics that part
greedy answers at near-ties, a context that grows, other programs). `trace` prints every replayed step of
chosen answers: what lookup offered, how much of it the answer keeps, and what the planner drafted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import EngineError
from ..lab.bench import parse_seeds, read_prompts
from ..methods import DEFAULT_MAX_DRAFT, DEFAULT_P_MIN, MAX_DRAFT_LIMIT
from .recording import Recording, on_device, record
from .replay_bounds import any_copy_bound, hindsight_bound, ngram_simple_draft, replay_ngram_simple
from .replay_loop import ReplayTarget, replay_lookup, replay_method
from .replay_tables import as_json, check, report, speed_ups, trace

# The pieces live apart (replay_loop: the methods replayed; replay_bounds: ngram-simple and the bounds;
# replay_tables: the figures as tables); research scripts and the tests take them from here.
__all__ = [
    "ReplayTarget",
    "any_copy_bound",
    "check",
    "hindsight_bound",
    "main",
    "ngram_simple_draft",
    "replay_lookup",
    "replay_method",
    "replay_ngram_simple",
    "report",
    "trace",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.measure.replay", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record plain answers and the step-cost curve")
    rec.add_argument("--model", default="embedded")
    rec.add_argument("--prompts", required=True, help="JSONL with id and prompt per line")
    rec.add_argument("--max-tokens", type=int, default=200)
    rec.add_argument("--chat", action="store_true", help="send each prompt as one user message (chat template)")
    rec.add_argument("--threads", type=int, default=None)
    rec.add_argument("--temperature", type=float, default=0.0, help="sample the answers (0: greedy)")
    rec.add_argument(
        "--seeds", type=parse_seeds, default=[1], help="with --temperature: one answer per seed, as 1-3 or 1,2,5"
    )
    rec.add_argument(
        "--draft",
        help="a draft model: record its proposal at every position too (greedy only), so draft and auto replay",
    )
    rec.add_argument("--p-min", type=float, default=DEFAULT_P_MIN, help="with --draft: its confidence cutoff")
    rec.add_argument(
        "--max-rows",
        type=int,
        default=MAX_DRAFT_LIMIT + 1,
        help="the widest step timed (wider ones are charged on the slope of the widest two)",
    )
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay", help="replay lookup, ngram-simple and the hindsight bound on a recording")
    rep.add_argument("recording")
    rep.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    rep.add_argument("--curves", help="a curves file from engine.measure.gpu_kit: predict on that device's step costs")
    rep.add_argument("--shape", help="with --curves: whose curve (e.g. qwen2-7b)")
    rep.add_argument(
        "--host-time",
        action="store_true",
        help="count the loop's own time on this machine too "
        "(planning, proposing, verifying; plain decoding's too): for a device whose steps are short",
    )
    rep.add_argument("--out", help="also write the figures as JSON (per method and answer, and geomeans)")
    rep.add_argument(
        "--draft-shape",
        help="with --curves: the draft's curve (e.g. qwen2-0.5b); without it, a prediction leaves draft and auto out",
    )
    ch = sub.add_parser("check", help="the replay's prediction beside live bench_compare figures of the same answers")
    ch.add_argument("recording")
    ch.add_argument("live", help="bench_compare --out JSON (greedy, --ignore-eos, the recording's --max-tokens)")
    ch.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    ch.add_argument("--host-time", action="store_true")
    tr = sub.add_parser("trace", help="every replayed lookup step: offered, keepable, drafted, accepted")
    tr.add_argument("recording")
    tr.add_argument("ids", nargs="*", help="answers to show (all when none)")
    tr.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    args = parser.parse_args(argv)
    if args.command == "record" and args.draft and args.temperature:
        parser.error("--draft records along greedy answers only (no --temperature)")
    if args.command == "replay" and args.curves and not args.shape:
        parser.error("--curves needs --shape")
    return args


def run_record(args: argparse.Namespace) -> None:
    recording = record(
        args.model,
        read_prompts(args.prompts),
        args.max_tokens,
        args.chat,
        args.threads,
        args.temperature,
        args.seeds,
        args.draft,
        args.p_min,
        args.max_rows,
    )
    recording.save(args.out)
    print(f"recorded {len(recording.answers)} answers to {args.out}")


def run_replay(args: argparse.Namespace) -> None:
    recording = Recording.load(args.recording)
    if args.curves:
        recording = on_device(recording, args.curves, args.shape, args.draft_shape)
    figures = speed_ups(recording, args.max_draft, args.host_time)
    print(report(recording, args.max_draft, figures, args.host_time))
    if args.out:
        Path(args.out).write_text(json.dumps(as_json(recording, figures), indent=1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "record":
            run_record(args)
        elif args.command == "check":
            live = json.loads(Path(args.live).read_text())
            print(check(Recording.load(args.recording), live, args.max_draft, args.host_time)[0])
        elif args.command == "trace":
            print(trace(Recording.load(args.recording), args.ids, args.max_draft))
        else:
            run_replay(args)
    except (EngineError, OSError, ValueError) as exc:  # a bad file, a draft that does not fit, a shape not timed
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
