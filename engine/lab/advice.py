"""What a lab run advises, in plain words: each method's standing against plain decoding by a named measure,
where it stops paying, the choice for one chat (with the draft length the chat's planner would pick), and the
chat settings that choice means. Pure functions of the results document, so the window, the CLI and a saved
file all give the same answer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..decoding.draft_planner import allocate_draft_rows
from ..decoding.speculation_config import SpeculationConfig
from ..decoding.step_costs import StepCosts
from ..methods import DRAFT_METHODS
from ..modelfiles.embedded import DISPLAY_NAMES
from .compare import MEASURES, PAYS, compare, sample_note, spread_note, throughput_words
from .crossover import cell_map, crossover, levels, method_words, methods, where_words


# --- the cost model, fed with the lab's own measurements ----------------------------------------
def _step_costs(results: dict, concurrency: int) -> StepCosts | None:
    """The chat's own cost model (decoding.step_costs.StepCosts) over the target step times the lab measured
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
    [k] = allocate_draft_rows([expected], [len(expected) - 1], 1, costs.measured_seconds, draft_s)
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
        return f"{where_words(env)}, {s.get('prompt_set', '?')} prompts"
    target = DISPLAY_NAMES.get(str(s.get("model"))) or env.get("model_name") or Path(str(s.get("model", "?"))).name
    draft = env.get("draft") or (s.get("draft") if set(s.get("methods", ())) & set(DRAFT_METHODS) else None)
    models = target + (f" with the draft {Path(str(draft)).name}" if draft else "")
    if "max_draft" not in s:
        drafting = "drafting as set"
    elif s.get("adaptive", True):
        drafting = f"adaptive drafting of at most {s['max_draft']} tokens a step"
    else:
        drafting = f"{s['max_draft']} draft tokens every step"
    where = where_words(env)
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
        return lines, max(ahead, key=lambda m: ahead[m])
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
