"""engine.lab.compare: one function gives each method's ratios to plain decoding, and the verdict (report.advise)
and the crossover read them from it; the small-sample rule says when a run is only a hint."""

from engine.lab.compare import PAYS, SMALL_SAMPLE_TOKENS, compare, sample_note, spread_note
from engine.lab.report import advise, crossover


def cell(method, concurrency, full, per_request, itl, tokens=2048, repeats=3):
    return {
        "method": method,
        "concurrency": concurrency,
        "generated_tokens": tokens,
        "repeats": repeats,
        "full_tokens_per_s": full,
        "aggregate_tokens_per_s": 0.9 * full,
        "per_request_tokens_per_s": per_request,
        "itl_p50_ms": itl,
        "per_position_acceptance": [],
        "full_tokens_per_s_runs": [full, 0.97 * full],
    }


def results(cells):
    return {
        "settings": {
            "prompt_set": "grounded",
            "model": "embedded",
            "methods": ["none", "lookup"],
            "max_draft": 8,
            "adaptive": True,
        },
        "env": {"backend": "CPU", "threads": 2, "model_name": "SmolLM2"},
        "cells": cells,
    }


def test_ratios_are_the_methods_figure_over_plain_decodings_with_latency_turned_so_above_one_is_better():
    found = compare(
        results(
            [
                cell("none", 1, 50.0, 40.0, 25.0),
                cell("lookup", 1, 41.5, 41.0, 20.0),
                cell("none", 2, 80.0, 35.0, 28.0),
                cell("lookup", 2, 100.0, 30.0, 33.0),
            ]
        )
    )
    assert set(found) == {("lookup", 1), ("lookup", 2)}  # plain decoding is compared with nothing
    one = found[("lookup", 1)]
    assert one["throughput"].ratio == 41.5 / 50.0 and one["throughput"].standing == "behind"
    assert one["per_request"].ratio == 41.0 / 40.0 and one["per_request"].standing == "tie"  # under PAYS
    assert one["latency"].ratio == 25.0 / 20.0 and one["latency"].standing == "ahead"
    assert one["latency"].text() == "20.0 vs 25.0 ms, 1.25× as fast"
    assert found[("lookup", 2)]["throughput"].ratio == 1.25


def test_a_figure_that_is_na_is_compared_with_nothing():
    found = compare(results([cell("none", 1, 50.0, None, 25.0), cell("lookup", 1, 60.0, 55.0, None)]))
    assert set(found[("lookup", 1)]) == {"throughput"}


def test_the_crossover_and_the_verdict_read_the_same_ratios():
    doc = results(
        [
            cell("none", 1, 50.0, 40.0, 25.0),
            cell("lookup", 1, 60.0, 48.0, 20.0),
            cell("none", 4, 120.0, 30.0, 33.0),
            cell("lookup", 4, 100.0, 25.0, 40.0),
        ]
    )
    found = compare(doc)
    cross = crossover(doc, "lookup")
    assert cross.speedups == [
        (1, found[("lookup", 1)]["throughput"].ratio),
        (4, found[("lookup", 4)]["throughput"].ratio),
    ]
    text = advise(doc).text
    assert "By throughput at full load, prompt lookup pays up to 1 concurrent chat (1.20×" in text
    assert "by per-request tok/s, prompt lookup made 1.20× (48.0 vs 40.0 tok/s)" in text
    assert "SmolLM2" in text and "Small sample" not in text  # 2048 tokens a cell, three runs
    assert advise(doc).settings == {"method": "lookup", "max_draft": 8, "adaptive": True}


def test_measures_that_disagree_recommend_nothing():
    # per request well ahead, throughput well behind: the run cannot say which the chat would feel
    doc = results([cell("none", 1, 50.0, 40.0, 25.0), cell("lookup", 1, 40.0, 48.0, 20.0)])
    advice = advise(doc)
    assert "the measures disagree" in advice.text and advice.settings == {}


def test_a_small_sample_is_named_by_its_rule():
    big = [cell("none", 1, 50.0, 40.0, 25.0), cell("lookup", 1, 60.0, 48.0, 20.0)]
    assert sample_note(results(big)) is None
    few = [dict(c, generated_tokens=SMALL_SAMPLE_TOKENS - 1) for c in big]
    assert f"{SMALL_SAMPLE_TOKENS - 1} tokens in the smallest cell, under {SMALL_SAMPLE_TOKENS}" in sample_note(
        results(few)
    )
    once = [dict(c, repeats=1) for c in big]
    assert "one run per cell" in sample_note(results(once)) and "hint" in sample_note(results(once))
    assert spread_note(results(big)) == "Runs of one cell were up to 3% apart."
    assert PAYS == 1.05
