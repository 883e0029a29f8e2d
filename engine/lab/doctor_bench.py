"""The system check's bench: plain decoding against prompt lookup (and the draft model, and both as auto) on one
code-editing prompt, a fixed number of rounds, its steps counted and the time left estimated (Steps); other
processes' CPU use measured meanwhile (CpuWatch); and what its figures say is wrong (bench_problems)."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from ..chat_format import ChatFormatter
from ..decoding.generate import SpeculativeDecoder
from ..decoding.proposers.base import NoProposer
from ..decoding.proposers.registry import proposer_for
from ..decoding.runtime import Model
from ..decoding.sampling import SamplingParams
from ..decoding.speculation_config import SpeculationConfig
from ..methods import DEFAULT_P_MIN, REGISTRY

# A code edit: the answer copies most of its prompt, as the edits people ask of a chat do.
BENCH_PROMPT = """Rename the variable `total` to `running_sum` in this function and change nothing else:

```python
def summarize(orders):
    total = 0
    for order in orders:
        if order.paid:
            total += order.amount
        else:
            print("unpaid order", order.id, "skipped")
    print("orders:", len(orders), "total:", total)
    return total
```"""
BENCH_TOKENS = 96
# Each method runs this many times, in turns, and its fastest run is kept: a fixed count, so the steps can be
# counted ("n of m") and the time left estimated from the runs already timed, whatever the machine's speed.
DEFAULT_ROUNDS = 2
# Other processes taking more than this share of the machine's CPU time while the bench runs make its figures
# unreliable (one busy process here cut llama.cpp from ~72 to ~24 tok/s, DESIGN.md): named as a problem.
BUSY_CPU_PERCENT = 25.0
# The window's method is reported when its fastest run is slower than plain decoding's fastest (ratio below 1).
SLOWER_THAN_PLAIN = 1.0
BENCH_NAMES = {"none": "plain", "lookup": "lookup", "draft": "draft", "auto": "auto"}  # method key -> bench row

Progress = Callable[[dict], None]


class Steps:
    """The check's steps, counted ("n of m"), each announced to `progress` with the time left estimated from the
    runs already timed: a method's own runs when it has some, else the mean of every run so far. Before any run
    is timed there is no estimate (None), and loading or calibrating is never extrapolated from."""

    def __init__(self, total: int, progress: Progress | None):
        self.total, self.done, self.progress = total, 0, progress
        self.started = time.perf_counter()
        self.runs: dict[str, list[float]] = {}  # method -> seconds of each timed run
        self.pending: list[str] = []  # the methods of the runs still to come, in order
        self.log: list[dict] = []  # each step done: what it measured and how long it took
        self._begun = (self.started, "")

    def left_s(self) -> float | None:
        timed = [t for ts in self.runs.values() for t in ts]
        if not timed or self.done < self.total - len(self.pending):
            return None
        mean = sum(timed) / len(timed)
        return sum(sum(self.runs[m]) / len(self.runs[m]) if self.runs.get(m) else mean for m in self.pending)

    def begin(self, doing: str) -> None:
        self._begun = (time.perf_counter(), doing)
        if self.progress is not None:
            left = self.left_s()
            self.progress(
                {
                    "step": self.done + 1,
                    "steps": self.total,
                    "doing": doing,
                    "elapsed_s": round(time.perf_counter() - self.started, 1),
                    "left_s": None if left is None else round(left, 1),
                    "left_is_estimate": True,
                }
            )

    def end(self, method: str | None = None, seconds: float | None = None) -> None:
        self.done += 1
        t, doing = self._begun
        self.log.append(
            {"step": self.done, "steps": self.total, "doing": doing, "seconds": round(time.perf_counter() - t, 1)}
        )
        if method is not None:
            assert seconds is not None  # a method's run is timed (run_methods)
            self.runs.setdefault(method, []).append(seconds)
            self.pending.pop(0)


class CpuWatch:
    """The share of the machine's CPU time other processes took between start() and stop(): the system's busy
    time (psutil.cpu_times) less this process's own (every thread of it, llama.cpp's included)."""

    def start(self) -> None:
        self.t0, self.sys0, self.own0 = time.perf_counter(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    @staticmethod
    def _own() -> float:
        t = psutil.Process().cpu_times()
        return t.user + t.system

    def stop(self) -> dict:
        wall, cores = time.perf_counter() - self.t0, psutil.cpu_count() or 1
        others = max(0.0, (self._busy() - self.sys0) - (self._own() - self.own0))
        percent = round(100 * others / (wall * cores), 1) if wall > 0 else None
        return {
            "others_percent": percent,
            "cores": cores,
            "threshold_percent": BUSY_CPU_PERCENT,
            "source": "psutil: the system's CPU time less this process's, during the runs",
        }


def bench(
    target: Model,
    draft: Model | None,
    rounds: int = DEFAULT_ROUNDS,
    steps: Steps | None = None,
    speculation: SpeculationConfig | None = None,
    p_min: float = DEFAULT_P_MIN,
) -> dict:
    """Plain decoding against prompt lookup (and the draft model, and both as auto) on BENCH_PROMPT, greedy,
    BENCH_TOKENS tokens each, `rounds` runs of each method taken in turns; each method's fastest run is kept, as
    other work on the machine only ever slows a run down. `steps` counts the calibration and each run;
    `speculation` and `p_min` are the chat's settings (draft lengths, the planner on or off), so each method runs
    as the chat would run it."""
    _, prompt, _ = ChatFormatter(target).render([{"role": "user", "content": BENCH_PROMPT}])  # as the chat sends it
    names = {"plain": "none", "lookup": "lookup", **({"draft": "draft", "auto": "auto"} if draft is not None else {})}
    methods = {
        name: proposer_for(method, target, draft, p_min, remember_requests=False) for name, method in names.items()
    }
    rounds = max(1, rounds)
    steps = steps or Steps(1 + rounds * len(methods), None)
    steps.pending += [name for _ in range(rounds) for name in methods]
    decoder = SpeculativeDecoder(target, NoProposer(), speculation or SpeculationConfig())
    steps.begin("timing each step size once (calibration)")
    decoder.calibrate()  # timed once per model file and kept (step_timings): the planner's costs are measured
    steps.end()
    started, cpu = time.perf_counter(), CpuWatch()
    cpu.start()
    runs = _timed_runs(decoder, prompt, methods, names, rounds, steps)
    best = {
        name: max(found, key=lambda r: r["tokens_per_s"] or 0.0) | {"runs": len(found)} for name, found in runs.items()
    }
    plain = best["plain"]["tokens_per_s"]
    for run in best.values():
        run["vs_plain"] = round(run["tokens_per_s"] / plain, 3) if plain and run["tokens_per_s"] else None
    return {
        "prompt": "a code edit (rename a variable in a 10-line function)",
        "prompt_tokens": len(prompt),
        "tokens": BENCH_TOKENS,
        "rounds": rounds,
        "seconds": round(time.perf_counter() - started, 1),
        "cpu": cpu.stop(),
        "methods": best,
    }


def _timed_runs(
    decoder: SpeculativeDecoder, prompt: list[int], methods: dict, names: dict[str, str], rounds: int, steps: Steps
) -> dict[str, list[dict]]:
    """Each method's runs, `rounds` of each taken in turns, every one announced and counted by `steps`."""
    runs: dict[str, list[dict]] = {name: [] for name in methods}
    for r in range(rounds):
        for name, proposer in methods.items():
            steps.begin(f"{REGISTRY[names[name]].prose}, run {r + 1} of {rounds}")
            t = time.perf_counter()
            decoder.set_speculation(proposer, decoder.speculation)  # a planner of its kind; the step costs kept
            decoder.forget()  # each run prefills the prompt afresh, so none starts ahead
            for _ in decoder.generate(
                prompt, SamplingParams(temperature=0.0), max_tokens=BENCH_TOKENS, ignore_eos=True
            ):
                pass
            s = decoder.stats
            runs[name].append(
                {
                    "tokens_per_s": s.decode_tokens_per_s,
                    "acceptance_rate": s.acceptance_rate,
                    "mean_acceptance_length": s.mean_acceptance_length,
                    "ttft_s": s.ttft_s,
                }
            )
            steps.end(name, time.perf_counter() - t)
    return runs


def bench_problems(b: dict, method: str) -> list[dict]:
    """After a bench: the window's method slower than plain decoding here, and a CPU too busy to trust."""
    found = []
    others = b["cpu"]["others_percent"]
    busy = others is not None and others > BUSY_CPU_PERCENT
    run = b["methods"].get(BENCH_NAMES.get(method, ""))
    if method != "none" and run is not None and run["vs_plain"] is not None and run["vs_plain"] < SLOWER_THAN_PLAIN:
        faster = [
            (r["vs_plain"], n)
            for n, r in b["methods"].items()
            if n != "plain" and r["vs_plain"] is not None and r["vs_plain"] > 1.0
        ]
        keys = {row: key for key, row in BENCH_NAMES.items()}
        choice = (
            f"choose {REGISTRY[keys[max(faster)[1]]].label} ({max(faster)[0]:g}× plain in the same bench)"
            if faster
            else "turn speculation off (plain decoding was the fastest here)"
        )
        runs = f"{run['runs']} run{'s' * (run['runs'] != 1)}"
        found.append(
            {
                "problem": f"{method} ran at {run['vs_plain']:g}× plain decoding on this machine (fastest of "
                f"{runs} each, measured just now): it slows answers down here.",
                "fix": ("measure again once the CPU is quiet (below); if it stays slower, " if busy else "")
                + f"Settings → Speculation: {choice}",
            }
        )
    if busy:
        found.append(
            {
                "problem": f"Other processes used {others:g}% of the CPU ({b['cpu']['cores']} cores) while the "
                f"speed was measured, above {BUSY_CPU_PERCENT:g}%: the figures above are not "
                "reliable.",
                "fix": "close or wait for the busy programs, then measure again",
            }
        )
    return found
