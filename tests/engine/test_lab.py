"""The speculation lab CLI end to end on tiny settings with the real model, and its reading of results."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.lab import cli
from engine.lab import local as lab
from engine.lab.report import advise, crossover

from support.this_build import MEMORY_KIND, UTILISATION_KIND

pytestmark = pytest.mark.slow  # lab runs from the command line

ROOT = Path(__file__).resolve().parents[2]
CELL_FIELDS = {
    "aggregate_tokens_per_s",
    "per_request_tokens_per_s",
    "itl_p50_ms",
    "itl_p95_ms",
    "e2e_p50_s",
    "e2e_p95_s",
    "acceptance_rate",
    "mean_acceptance_length",
    "utilisation",
    "memory",
}


COPY = "Colours: red, green, blue, yellow, purple, orange, white.\nThe same colours again: red, green,"
OPEN = "The best way to spend three days in Kyoto is"


@pytest.fixture
def tiny_prompts(tmp_path):
    path = tmp_path / "tiny.jsonl"  # short prompts: the run is about decoding, not prefill
    path.write_text(
        json.dumps({"id": "copy", "prompt": COPY}) + "\n" + json.dumps({"id": "open", "prompt": OPEN}) + "\n"
    )
    return path


def test_cli_writes_results_plot_and_summary(tiny_prompts, tmp_path):
    # A real `python -m engine.lab`, in a process of its own (its sys.path, not pytest's).
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.lab",
            "--model",
            "embedded",
            "--methods",
            "none,lookup",
            "--concurrency",
            "1,2",
            "--prompts",
            str(tiny_prompts),
            "--max-tokens",
            "8",
            "--out",
            str(out),
            "--threads",
            "2",
            "--no-adaptive",
            "--max-draft",
            "4",
            "--repeats",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    cells = {(c["method"], c["concurrency"]): c for c in results["cells"]}
    assert set(cells) == {("none", 1), ("lookup", 1), ("none", 2), ("lookup", 2)}
    for cell in cells.values():
        assert set(cell) >= CELL_FIELDS
        assert cell["requests"] == 2 and cell["generated_tokens"] == 16  # end tokens ignored: equal work
        assert cell["aggregate_tokens_per_s"] > 0 and cell["itl_p95_ms"] >= cell["itl_p50_ms"] > 0
        assert cell["e2e_p95_s"] >= cell["e2e_p50_s"] > 0
        assert cell["utilisation"]["kind"] == UTILISATION_KIND and cell["utilisation"]["percent"] > 0  # labelled
        assert cell["memory"]["kind"] == MEMORY_KIND and cell["memory"]["bytes"] > 100 * 2**20
        assert cell["repeats"] == 2 and cell["full_tokens_per_s"] == max(cell["full_tokens_per_s_runs"])
        # every token but each request's first (its prefill's) came from a step with every slot busy
        assert (
            cell["full_tokens"]
            == cell["generated_tokens"] + cell["filler_tokens"] - cell["requests"] - cell["filler_requests"]
        )
        assert cell["full_tokens_per_s"] > cell["aggregate_tokens_per_s"]  # prefills left out
    assert cells[("none", 1)]["acceptance_rate"] is None and cells[("none", 1)]["mean_acceptance_length"] is None
    spec = cells[("lookup", 2)]
    assert spec["drafted"] > 0 and 0.0 <= spec["acceptance_rate"] <= 1.0
    assert spec["mean_acceptance_length"] >= 1 + spec["accepted"] / spec["verify_steps"]  # per step that drafted
    assert spec["batch_steps"] < 16  # two sequences shared each target step
    # one sequence at a time at 1; at 2, two in every step to the end: plain decoding's equal answers end together,
    # and where lookup ended one answer first a filler took its slot until the other was answered
    assert cells[("none", 1)]["mean_in_flight"] == cells[("lookup", 1)]["mean_in_flight"] == pytest.approx(1.0)
    assert cells[("none", 2)]["mean_in_flight"] == spec["mean_in_flight"] == pytest.approx(2.0)
    assert cells[("none", 2)]["filler_requests"] == cells[("none", 1)]["filler_requests"] == 0
    assert spec["filler_requests"] >= 1 and 0 < spec["filler_tokens"] < 16  # ended with the level
    assert set(results["crossover"]) == {"lookup"}
    # a recommendation carries the drafting the lab ran (--no-adaptive, --max-draft 4), never a cap or mode it did
    # not run; a tie or measures that disagree recommend nothing, and plain decoding carries no drafting
    advice = results["advice"]["settings"]
    assert advice in ({}, {"method": "none"}) or (advice["adaptive"] is False and advice["max_draft"] == 4)

    png = (out / "plot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    summary = (out / "summary.md").read_text()
    assert "## Crossover" in summary and "prompt lookup" in summary and "| lookup | 2 |" in summary
    assert "lookup × 2" in done.stderr and "tok/s at full load" in done.stderr  # progress, cell by cell
    assert "## Crossover" in done.stdout  # the summary, printed too


def test_cli_refuses_the_draft_method_without_a_draft_model(tiny_prompts, tmp_path, capsys):
    code = cli.main(
        [
            "--model",
            "embedded",
            "--methods",
            "none,draft",
            "--prompts",
            str(tiny_prompts),
            "--max-tokens",
            "4",
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert code == 2 and "draft model" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def synthetic(ratios: dict[int, float], plain=(80.0, 90.0, 130.0, 180.0)) -> dict:
    """A results document with given lookup speed-ups (analysis input only: no figure here is reported)."""
    cells = []
    for level, base in zip(sorted(ratios), plain):
        cells.append(
            {"method": "none", "concurrency": level, "aggregate_tokens_per_s": base, "per_position_acceptance": []}
        )
        cells.append(
            {
                "method": "lookup",
                "concurrency": level,
                "aggregate_tokens_per_s": base * ratios[level],
                "per_position_acceptance": [0.9, 0.8, 0.5, 0.1],
            }
        )
    for c in cells:  # step time by rows at concurrency 1: 1 row 10 ms, each extra row +3 ms
        if c["concurrency"] == 1:
            c["step_time_by_rows"] = {str(r): {"steps": 10, "mean_ms": 10.0 + 3.0 * (r - 1)} for r in (1, 3, 5)}
    return {
        "settings": {"prompt_set": "grounded", "max_draft": 8},
        "env": {"backend": "CPU", "threads": 2},
        "cells": cells,
    }


def test_crossover_is_where_speculation_stops_beating_plain_decoding():
    cross = crossover(synthetic({1: 1.6, 2: 1.2, 4: 0.9, 8: 0.7}), "lookup")
    assert (cross.pays_up_to, cross.stops_at) == (2, 4)
    assert 2 < cross.estimate < 4
    never = crossover(synthetic({1: 0.9, 2: 0.8, 4: 0.7, 8: 0.6}), "lookup")
    assert (never.pays_up_to, never.stops_at, never.estimate) == (None, 1, None)
    always = crossover(synthetic({1: 1.5, 2: 1.4, 4: 1.2, 8: 1.1}), "lookup")
    assert (always.pays_up_to, always.stops_at) == (8, None)
    tie = crossover(synthetic({1: 1.3, 2: 1.2, 4: 1.1, 8: 1.02}), "lookup")  # a 2% lead is within the spread
    assert (tie.pays_up_to, tie.stops_at) == (4, 8) and 4 < tie.estimate < 8


def test_advice_names_the_crossover_and_a_draft_length_from_the_cost_model():
    advice = advise(synthetic({1: 1.6, 2: 1.2, 4: 0.9, 8: 0.7}))
    assert "prompt lookup pays up to 2 concurrent chats" in advice.text and "0.90× at 4" in advice.text
    # E(k) / step(k+1 rows): k=1 1.9/13 ms, k=2 2.7/16 ms (best), k=3 3.2/19 ms, k=4 3.3/22 ms.
    assert "prompt lookup with k=2 is best" in advice.text
    # The chat keeps choosing k per step: the advice names k but does not cap the chat at it; the cap it
    # recommends is the one the lab ran (8 here), never one it did not run.
    assert advice.settings == {"method": "lookup", "max_draft": 8, "adaptive": True}
    plain = advise(synthetic({1: 0.9, 2: 0.8, 4: 0.7, 8: 0.6}))
    assert plain.settings["method"] == "none" and "did not pay" in plain.text


def test_a_chat_run_with_auto_measures_what_drafting_costs(tiny_prompts):
    """--chat: each prompt as a user message in the model's template; auto beside plain decoding, with the share of
    the level's time spent proposing and the draft model's weights in its cell (none for plain decoding)."""
    from engine.decoding.runtime import Model
    from engine.modelfiles.embedded import resolve_model

    with Model(resolve_model("embedded"), vocab_only=True) as vocab:
        chat = lab.prompt_tokenizer(vocab, chat=True)(COPY)
        assert len(chat) > len(vocab.tokenize(COPY)) + 3  # the template's turn markers around the text
    results = lab.run_lab(
        lab.LabConfig(
            prompts=str(tiny_prompts),
            model="embedded",
            draft="embedded",
            chat=True,
            methods=("none", "auto"),
            concurrency=(1,),
            max_tokens=6,
            threads=2,
        )
    )
    cells = {c["method"]: c for c in results["cells"]}
    assert cells["none"]["draft_share"] is None and cells["none"]["draft_model_bytes"] is None
    assert 0.0 <= cells["auto"]["draft_share"] < 1.0 and cells["auto"]["draft_model_bytes"] > 50 * 2**20
    assert results["settings"]["chat"] is True
