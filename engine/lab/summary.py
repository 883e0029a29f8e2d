"""A lab run as markdown (summary.md): the settings, the table of every cell, the crossover, the advice and how
each figure is measured. The cells' utilisation and memory read as the lab window's table shows them."""

from __future__ import annotations

import json

from .advice import with_analysis
from .compare import PAYS
from .crossover import method_words, methods, speedups, threads_words

HOW_MEASURED = [
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
    "- acceptance = accepted ÷ drafted; mean accepted length = 1 + accepted ÷ steps that verified drafts.",
    "- utilisation: GPU from NVML where readable, else this process's CPU time ÷ wall time over all "
    "cores; memory: VRAM where readable, else the process's resident RAM.",
]
HOW_MEASURED_REMOTE = (
    "- remote servers: every time is taken here as the streamed text arrives (the network included); "
    "a server is a method, by the name given it; a client done with its requests sends fillers until every "
    "client is, as the local levels do; full load is what streamed while as many answers streamed at "
    "once as ever did in the level, each past its first token; acceptance from its timings or its /metrics counters; "
    "utilisation and memory are the servers' and read n/a."
)


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


def _heading(results: dict) -> list[str]:
    """The title and the line of settings the run was measured with."""
    s, env = results["settings"], results.get("env", {})
    requests = sorted({(c["concurrency"], c["requests"]) for c in results["cells"]})
    return [
        f"# Speculation lab: {s.get('prompt_set', '?')} prompts, {env.get('model_name', s.get('model'))}",
        "",
        f"{results.get('created', '')}. Backend {env.get('backend', '?')}, {threads_words(env)}; "
        f"{s['max_tokens']} tokens per request ({'end tokens ignored' if s.get('ignore_eos') else 'stopping at end tokens'}); "
        f"requests per level: {', '.join(f'{n} at {c}' for c, n in requests)}; "
        + (
            f"speculation as each server is set up, temperature {s['temperature']}"
            if env.get("remote")
            else f"max draft {s['max_draft']}, adaptive {'on' if s['adaptive'] else 'off'}, temperature {s['temperature']}"
        )
        + (f"; each cell the fastest of {s['repeats']} runs, methods alternating." if s.get("repeats", 1) > 1 else "."),
    ]


def _crossover_section(results: dict) -> list[str]:
    """Each method's crossover, as the results document holds it, and what "pays" means."""
    lines = ["## Crossover"]
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
    return lines


def _advice_section(results: dict) -> list[str]:
    recommended = results["advice"]["settings"]
    return [
        "",
        "## Advice",
        "",
        *results["advice"]["lines"],
        "",
        f"Recommended chat settings: `{json.dumps(recommended)}`"
        if recommended
        else "The servers' speculation is set where they run: nothing here to apply."
        if results.get("env", {}).get("remote")
        else "No chat settings recommended (the advice above says why).",
    ]


def summary_markdown(results: dict) -> str:
    results = results if "advice" in results else with_analysis(results)
    remote = results.get("env", {}).get("remote")
    lines = [
        *_heading(results),
        "",
        results_table(results),
        "",
        *_crossover_section(results),
        *_advice_section(results),
        "",
        "## How the figures are measured",
        "",
        *HOW_MEASURED,
        *([HOW_MEASURED_REMOTE] if remote else []),
    ]
    return "\n".join(lines) + "\n"
