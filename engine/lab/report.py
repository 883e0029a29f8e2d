"""Reading a lab run: speed-ups against plain decoding, the crossover concurrency, advice in plain
words, the markdown summary and the plot. Pure functions of the results document, so the window,
the CLI and a saved file all give the same answer.

python -m engine.lab.report DIR [DIR ...] --out PLOT.png   (one plot of several runs, a row each)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ..decoding.cost_model import SpeculationConfig, StepCosts, allocate_draft_rows
from ..methods import DRAFT_METHODS  # a table; this module's method_words says one
from ..methods import method_words as registry_words
from ..modelfiles.embedded import DISPLAY_NAMES
from .compare import MEASURES, PAYS, compare, compare_cells, sample_note, spread_note, throughput, throughput_words

METHOD_WORDS = registry_words("prose")
METHOD_COLOURS = registry_words("colour")


def method_words(method: str) -> str:
    """A method in words; a server of a remote run (engine/lab/remote.py) by the name it was given."""
    return METHOD_WORDS.get(method, method)


def _threads(env: dict) -> str:
    if env.get("remote"):
        return "the servers' own threads"
    n = env.get("threads", "?")
    return f"{n} thread{'' if n == 1 else 's'}"


def _where(env: dict) -> str:
    if env.get("remote"):
        return f"On the servers ({', '.join(f'{n} {u}' for n, u in env.get('servers', {}).items())})"
    return f"On this machine ({env.get('backend', '?')}, {_threads(env)})"


def cell_map(results: dict) -> dict[tuple[str, int], dict]:
    return {(c["method"], c["concurrency"]): c for c in results["cells"]}


def levels(results: dict) -> list[int]:
    return sorted({c["concurrency"] for c in results["cells"]})


def methods(results: dict) -> list[str]:
    seen: list[str] = []
    for c in results["cells"]:
        if c["method"] not in seen:
            seen.append(c["method"])
    return seen


def least_disturbed(runs: list[dict]) -> dict:
    """Of repeated runs of one cell (the lab's, or against servers), the fastest: other work on the machine only
    ever slows a run down. Every run's throughput stays in the cell, so the spread is visible."""
    best = dict(max(runs, key=lambda c: throughput(c) or 0.0))
    best["repeats"] = len(runs)
    best["aggregate_tokens_per_s_runs"] = [c["aggregate_tokens_per_s"] for c in runs]
    best["full_tokens_per_s_runs"] = [c.get("full_tokens_per_s") for c in runs]
    return best


def speedups(results: dict, method: str, base: str = "none") -> list[tuple[int, float]]:
    """(concurrency, throughput of method ÷ plain decoding's (base's)) where both were measured."""
    cells = cell_map(results)
    out = []
    for level in levels(results):
        spec, plain = cells.get((method, level)), cells.get((base, level))
        found = compare_cells(spec, plain).get("throughput") if spec else None
        if found:
            out.append((level, found.ratio))
    return out


@dataclass(frozen=True)
class Crossover:
    method: str
    speedups: list[tuple[int, float]]
    pays_up_to: int | None  # the highest level up to which the method paid (see PAYS) at every level
    stops_at: int | None  # the first level where it did not: the crossover, as measured
    estimate: float | None  # where the speed-up falls to PAYS, interpolated on a log2 concurrency axis

    def to_dict(self) -> dict:
        return {
            "pays_up_to": self.pays_up_to,
            "stops_at": self.stops_at,
            "estimate": self.estimate,
            "speedups": {str(c): r for c, r in self.speedups},
        }


def crossover(results: dict, method: str, base: str = "none") -> Crossover | None:
    ratios = speedups(results, method, base)
    if not ratios:
        return None
    pays_up_to = stops_at = None
    for level, ratio in ratios:
        if ratio < PAYS:
            stops_at = level
            break
        pays_up_to = level
    estimate = None
    if pays_up_to is not None and stops_at is not None:
        r0, r1 = dict(ratios)[pays_up_to], dict(ratios)[stops_at]
        x0, x1 = math.log2(pays_up_to), math.log2(stops_at)
        estimate = 2 ** (x0 + (r0 - PAYS) / (r0 - r1) * (x1 - x0))
    return Crossover(method, ratios, pays_up_to, stops_at, estimate)


# --- the cost model, fed with the lab's own measurements ----------------------------------------
def _step_costs(results: dict, concurrency: int) -> StepCosts | None:
    """The chat's own cost model (decoding.cost_model.StepCosts) over the target step times the lab measured
    at one concurrency, all methods pooled; None if nothing was measured there."""
    pooled: dict[int, list[float]] = {}
    for c in results["cells"]:
        if c["concurrency"] != concurrency:
            continue
        for rows, entry in c.get("step_time_by_rows", {}).items():
            n = pooled.setdefault(int(rows), [0, 0.0])
            n[0] += entry["steps"]
            n[1] += entry["steps"] * entry["mean_ms"] / 1000.0
    known = sorted((r, total / n) for r, (n, total) in pooled.items() if n)
    if not known:
        return None
    costs = StepCosts()
    for rows, seconds in known:  # each size's mean becomes its base; between and beyond, the model's rules
        costs.record(rows, seconds)
    return costs


def best_draft_length(results: dict, method: str) -> int | None:
    """For one chat: the draft length the chat's planner would choose (allocate_draft_rows, one sequence)
    from the acceptance per draft slot and the step times measured at concurrency 1."""
    cell = cell_map(results).get((method, 1))
    costs = _step_costs(results, 1)
    if not cell or not cell["per_position_acceptance"] or costs is None:
        return None
    draft_s = (cell.get("draft_ms_per_token") or 0.0) / 1000.0 if method in ("draft", "auto") else 0.0
    expected = [1.0]
    for acceptance in cell["per_position_acceptance"]:
        expected.append(expected[-1] + acceptance)  # share of steps whose draft was kept through slot k
    [k] = allocate_draft_rows([expected], [len(expected) - 1], 1, costs.seconds, draft_s)
    return k


# --- advice -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Advice:
    lines: list[str]
    settings: dict  # what "apply" sets in the chat: method, max_draft, adaptive (and draft)

    @property
    def text(self) -> str:
        return " ".join(self.lines)


def scope_words(results: dict) -> str:
    """What the run measured: the models (by name), where, on which prompts, with what drafting."""
    s, env = results["settings"], results.get("env", {})
    if env.get("remote"):
        return f"{_where(env)}, {s.get('prompt_set', '?')} prompts"
    target = DISPLAY_NAMES.get(str(s.get("model"))) or env.get("model_name") or Path(str(s.get("model", "?"))).name
    draft = env.get("draft") or (s.get("draft") if set(s.get("methods", ())) & set(DRAFT_METHODS) else None)
    models = target + (f" with the draft {Path(str(draft)).name}" if draft else "")
    if "max_draft" not in s:
        drafting = "drafting as set"
    elif s.get("adaptive", True):
        drafting = f"adaptive drafting of at most {s['max_draft']} tokens a step"
    else:
        drafting = f"{s['max_draft']} draft tokens every step"
    where = _where(env)
    return f"{models}, {where[0].lower() + where[1:]}, {s.get('prompt_set', '?')} prompts, {drafting}"


def _crossover_lines(results: dict) -> list[str]:
    """Where each method stops paying as concurrency rises, by throughput (the measure named)."""
    noun = "client" if results.get("env", {}).get("remote") else "chat"
    who = lambda n: noun if n == 1 else noun + "s"  # noqa: E731
    lines = []
    for method in methods(results):
        cross = crossover(results, method) if method != "none" else None
        if cross is None:
            continue
        words, first = method_words(method), cross.speedups[0]
        by = f"By {throughput_words(cell_map(results)[(method, first[0])])}"
        if cross.stops_at is None:
            lines.append(
                f"{by}, {words} paid at every tested level, up to {cross.pays_up_to} concurrent "
                f"{who(cross.pays_up_to)} ({first[1]:.2f}× plain decoding's at {first[0]})."
            )
        elif cross.pays_up_to is None:
            lines.append(
                f"{by}, {words} did not pay even at {first[0]} concurrent {who(first[0])} "
                f"({first[1]:.2f}× plain decoding's)."
            )
        else:
            at_stop = dict(cross.speedups)[cross.stops_at]
            lines.append(
                f"{by}, {words} pays up to {cross.pays_up_to} concurrent {who(cross.pays_up_to)} "
                f"({first[1]:.2f}× plain decoding's at {first[0]}); from {cross.stops_at} on it no longer "
                f"pays ({at_stop:.2f}× at {cross.stops_at})."
            )
    return lines


def _single_chat(results: dict) -> tuple[list[str], str | None]:
    """For one chat (the lowest level): each method against plain decoding by per-request tok/s (what the chat's
    tok/s counts; throughput where that is n/a), its latency beside it; and the method to recommend, or None where
    the run cannot tell (a tie, or its measures disagree)."""
    level = min(levels(results))
    found = {m: c for (m, lv), c in compare(results).items() if lv == level}
    lines, ahead, behind, disagree = [], {}, [], []
    where = "one chat" if level == 1 else f"{level} concurrent chats"
    for method, c in found.items():
        key = "per_request" if "per_request" in c else "throughput"
        if key not in c:
            continue
        main = c[key]
        text = (
            f"At {where}, by {'per-request tok/s' if key == 'per_request' else 'throughput'}, "
            f"{method_words(method)} made {main.text()}: {_standing_words(main)}"
        )
        if "latency" in c:
            text += f"; ITL p50 {c['latency'].text()}"
        lines.append(text + ".")
        others = [c[k] for k in ("throughput", "latency") if k in c and k != key]
        against = [o for o in others if {o.standing, main.standing} == {"ahead", "behind"}]
        if against:  # one measure ahead, another behind: the run cannot say which the chat would feel
            disagree.append(method)
            said = ", ".join(f"{MEASURES[o.measure].words} {o.ratio_text()}" for o in against)
            lines.append(f"At {where} the same run says {said}: the measures disagree for {method_words(method)}.")
        if main.standing == "ahead":
            ahead[method] = main.ratio
        elif main.standing == "behind":
            behind.append(method)
    if disagree:
        return lines, None
    if ahead:
        return lines, max(ahead, key=ahead.get)
    if found and len(behind) == len(found):
        return lines, "none"
    return lines, None


def _standing_words(c) -> str:
    return {
        "ahead": "ahead of plain decoding",
        "behind": "behind plain decoding",
        "tie": f"a tie (within {PAYS - 1:.0%})",
    }[c.standing]


def advise(results: dict) -> Advice:
    """The verdict: what was measured (models, where, prompts), each method's standing by a named measure, the
    choice for one chat and how far the sample can be trusted; and the settings that choice means."""
    settings, env = results["settings"], results.get("env", {})
    lines = [("" if env.get("remote") else "Measured: ") + f"{scope_words(results)}."] + _crossover_lines(results)
    single, best = _single_chat(results)
    lines += single
    if env.get("remote"):  # nothing here to apply: the servers' speculation is set where they run
        if best:
            lines.append(f"For a single client, {method_words(best)} was fastest.")
        return Advice(lines + _sample_lines(results), {})
    recommended: dict = {}
    if best is None:
        lines.append("For a single chat, no method was clearly ahead: nothing to recommend from this run.")
    elif best == "none":
        lines.append("For a single chat, plain decoding was fastest here.")
        recommended = {"method": "none"}
    else:
        k = best_draft_length(results, best)
        lines.append(f"For a single chat, {method_words(best)}" + (f" with k={k}" if k else "") + " is best.")
        # What the run itself used: a recommendation never names a draft cap or mode the lab did not run.
        recommended = {
            "method": best,
            "max_draft": settings.get("max_draft", SpeculationConfig().max_draft),
            "adaptive": settings.get("adaptive", True),
        }
        if best in DRAFT_METHODS:
            recommended["draft"] = settings.get("draft")
    return Advice(lines + _sample_lines(results), recommended)


def _sample_lines(results: dict) -> list[str]:
    return [note for note in (sample_note(results), spread_note(results)) if note]


def with_analysis(results: dict) -> dict:
    """The results document with its crossover and advice filled in."""
    crossovers = {m: crossover(results, m) for m in methods(results) if m != "none"}
    advice = advise(results)
    return {
        **results,
        "crossover": {m: c.to_dict() for m, c in crossovers.items() if c},
        "advice": {"text": advice.text, "lines": advice.lines, "settings": advice.settings},
    }


# --- the markdown summary -----------------------------------------------------------------------
def _f(value, fmt: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, fmt)


def utilisation_text(cell: dict) -> str:
    """A cell's utilisation as the report and the lab window's table show it."""
    u = cell.get("utilisation") or {}
    if u.get("kind") == "remote":
        return "n/a (remote)"
    return (
        f"{u.get('kind', '?')} {_f(u.get('percent'), '.0f')}%"
        if u.get("percent") is not None
        else f"{u.get('kind', '?')} n/a"
    )


def memory_text(cell: dict) -> str:
    """A cell's memory as the report and the lab window's table show it."""
    m = cell.get("memory") or {}
    if m.get("kind") == "remote":
        return "n/a (remote)"
    device = f" ({m['device']})" if m.get("device") else ""  # the GPU's name, for VRAM
    return (
        f"{m.get('kind', '?')} {_f(m.get('bytes'), '.0f', 2**-20)} MiB{device}"
        if m.get("bytes")
        else f"{m.get('kind', '?')} n/a"
    )


def results_table(results: dict) -> str:
    ratios = {(m, c): r for m in methods(results) for c, r in speedups(results, m)}
    head = (
        "| method | concurrency | in flight | full-load tok/s | vs plain | aggregate tok/s | per-request tok/s "
        "| ITL p50 / p95 ms | end-to-end p50 / p95 s | acceptance | mean accepted length | drafting | draft model "
        "| utilisation | memory |"
    )
    rows = [head, "|" + "---|" * 15]
    for c in sorted(results["cells"], key=lambda c: (c["concurrency"], methods(results).index(c["method"]))):
        ratio = ratios.get((c["method"], c["concurrency"]))
        rows.append(
            f"| {c['method']} | {c['concurrency']} | {_f(c.get('mean_in_flight'), '.1f')} "
            f"| {_f(c.get('full_tokens_per_s'), '.1f')} "
            f"| {'—' if c['method'] == 'none' else _f(ratio, '.2f') + '×'} "
            f"| {_f(c['aggregate_tokens_per_s'], '.1f')} "
            f"| {_f(c['per_request_tokens_per_s'], '.1f')} "
            f"| {_f(c['itl_p50_ms'], '.1f')} / {_f(c['itl_p95_ms'], '.1f')} "
            f"| {_f(c['e2e_p50_s'], '.2f')} / {_f(c['e2e_p95_s'], '.2f')} "
            f"| {_f(c['acceptance_rate'], '.0%')} | {_f(c['mean_acceptance_length'], '.2f')} "
            f"| {_f(c.get('draft_share'), '.0%')} | {_f(c.get('draft_model_bytes'), '.0f', 2**-20)}"
            f"{' MiB' if c.get('draft_model_bytes') else ''} "
            f"| {utilisation_text(c)} | {memory_text(c)} |"
        )
    return "\n".join(rows)


def summary_markdown(results: dict) -> str:
    results = results if "advice" in results else with_analysis(results)
    s, env = results["settings"], results.get("env", {})
    requests = sorted({(c["concurrency"], c["requests"]) for c in results["cells"]})
    lines = [
        f"# Speculation lab: {s.get('prompt_set', '?')} prompts, {env.get('model_name', s.get('model'))}",
        "",
        f"{results.get('created', '')}. Backend {env.get('backend', '?')}, {_threads(env)}; "
        f"{s['max_tokens']} tokens per request ({'end tokens ignored' if s.get('ignore_eos') else 'stopping at end tokens'}); "
        f"requests per level: {', '.join(f'{n} at {c}' for c, n in requests)}; "
        + (
            f"speculation as each server is set up, temperature {s['temperature']}"
            if env.get("remote")
            else f"max draft {s['max_draft']}, adaptive {'on' if s['adaptive'] else 'off'}, temperature {s['temperature']}"
        )
        + (f"; each cell the fastest of {s['repeats']} runs, methods alternating." if s.get("repeats", 1) > 1 else "."),
        "",
        results_table(results),
        "",
        "## Crossover",
    ]
    for method, cross in results.get("crossover", {}).items():
        words = method_words(method)
        ratios = ", ".join(f"{r:.2f}× at {c}" for c, r in cross["speedups"].items())
        if cross["stops_at"] is None:
            lines.append(f"- {words}: pays at every tested level (no crossover up to {cross['pays_up_to']}): {ratios}.")
        elif cross["pays_up_to"] is None:
            lines.append(
                f"- {words}: does not pay even at {cross['stops_at']} (crossover at or below the lowest "
                f"level): {ratios}."
            )
        else:
            lines.append(
                f"- {words}: pays up to concurrency {cross['pays_up_to']}, stops paying at "
                f"{cross['stops_at']}; the speed-up falls to {PAYS:.2f}× at about {cross['estimate']:.1f} "
                f"concurrent sequences: {ratios}."
            )
    lines.append(
        f'\n"Pays" means at least {PAYS:.2f}× plain decoding\'s throughput at the same concurrency (at full '
        "load where measured, else the aggregate); a smaller lead is within run-to-run spread."
    )
    recommended = results["advice"]["settings"]
    lines += [
        "",
        "## Advice",
        "",
        *results["advice"]["lines"],
        "",
        f"Recommended chat settings: `{json.dumps(recommended)}`"
        if recommended
        else "The servers' speculation is set where they run: nothing here to apply."
        if env.get("remote")
        else "No chat settings recommended (the advice above says why).",
        "",
        "## How the figures are measured",
        "",
        "- in flight: the sequences decoding in a step, averaged over the level's step time. Until the last "
        "request is answered, a slot that frees once no request waits takes a filler (the same prompts again, "
        "in turn; ended with the level), as a busy server's queue would refill it: without them the slowest "
        "answers decoded with fewer beside them, and a method that ends some answers early was judged partly "
        "at a lower concurrency.",
        "- full-load tok/s: the tokens delivered by the steps that had every slot busy ÷ those steps' time "
        "(proposing included, prefills not). Speed-ups, the crossover and the plot use it (the aggregate where "
        "it is n/a): a filler admitted just before the level ends pays its whole prefill for a few tokens, and "
        "a method that ends answers sooner admits more.",
        "- aggregate tok/s: all generated tokens, the fillers' included, ÷ the level's wall time (prefills included).",
        "- per-request tok/s: each request's generated tokens after its first ÷ the time after its first token "
        "(the chat's tok/s; llama.cpp's predicted_per_second counts the first token too); the mean over the "
        "level's requests.",
        "- ITL: time between a request's token deliveries, a step that delivers m tokens counting as m gaps "
        "of a 1/m share; p50 and p95 over all tokens of the level.",
        "- end-to-end: from a request's admission (its prefill) to its last token.",
        "- acceptance = accepted ÷ drafted; mean accepted length = 1 + accepted ÷ target steps.",
        "- utilisation: GPU from NVML where readable, else this process's CPU time ÷ wall time over all "
        "cores; memory: VRAM where readable, else the process's resident RAM.",
        *(
            [
                "- remote servers: every time is taken here as the streamed text arrives (the network included); "
                "a server is a method, by the name given it; a client done with its requests sends fillers until every "
                "client is, as the local levels do; full load is what streamed while as many answers streamed at "
                "once as ever did in the level, each past its first token; acceptance from its timings or its /metrics counters; "
                "utilisation and memory are the servers' and read n/a."
            ]
            if results.get("env", {}).get("remote")
            else []
        ),
    ]
    return "\n".join(lines) + "\n"


# --- the plot -----------------------------------------------------------------------------------
def write_plot(runs: list[tuple[str, dict]], path: str | Path) -> None:
    """Throughput and inter-token latency vs concurrency, one line per method, a row per run."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 5.4 * len(runs)), squeeze=False)
    for (label, results), (ax_rate, ax_itl) in zip(runs, axes):
        cells = cell_map(results)
        xs = levels(results)
        marked = 0  # crossover labels so far: each goes above the last, as two may fall at one level
        for method in methods(results):
            colour = METHOD_COLOURS.get(method)
            pts = [(c, cells[(method, c)]) for c in xs if (method, c) in cells]
            conc = [c for c, _ in pts]
            ax_rate.plot(
                conc,
                [throughput(cell) or float("nan") for _, cell in pts],
                "o-",
                color=colour,
                label=method_words(method),
            )
            ax_itl.plot(
                conc,
                [cell["itl_p50_ms"] or float("nan") for _, cell in pts],
                "o-",
                color=colour,
                label=f"{method_words(method)} p50",
            )
            ax_itl.plot(
                conc,
                [cell["itl_p95_ms"] or float("nan") for _, cell in pts],
                "s--",
                color=colour,
                alpha=0.6,
                label=f"{method_words(method)} p95",
            )
            cross = crossover(results, method) if method != "none" else None
            if cross and cross.stops_at is not None:
                at = cross.estimate or cross.stops_at
                for ax in (ax_rate, ax_itl):
                    ax.axvline(at, color=colour, linestyle=":", alpha=0.8)
                right_half = math.log2(at) > (math.log2(xs[0]) + math.log2(xs[-1])) / 2
                ax_rate.annotate(
                    f"{method_words(method)} stops paying\n≈ {at:.1f}",
                    (at, 0.04 + 0.13 * marked),
                    xycoords=("data", "axes fraction"),
                    color=colour,
                    fontsize=8,
                    ha="right" if right_half else "left",
                    xytext=(-4 if right_half else 4, 0),
                    textcoords="offset points",
                )
                marked += 1
        env = results.get("env", {})
        for ax, title, unit in (
            (ax_rate, "decode throughput, every slot busy", "tokens/s"),
            (ax_itl, "inter-token latency", "ms per token"),
        ):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel("concurrent sequences")
            ax.set_ylabel(unit)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.set_title(f"{label}: {title} ({env.get('backend', '?')}, {_threads(env)})", fontsize=10)
            # below the axes: inside, "best" still sat on the crossover labels or the lines
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.lab.report", description="Plot several lab runs together.")
    ap.add_argument("dirs", nargs="+", help="folders written by python -m engine.lab")
    ap.add_argument("--out", required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    runs = []
    for d in args.dirs:
        results = json.loads((Path(d) / "results.json").read_text(encoding="utf-8"))
        runs.append((results["settings"].get("prompt_set", Path(d).name), results))
    write_plot(runs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
