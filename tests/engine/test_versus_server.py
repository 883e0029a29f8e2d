"""The side-by-side with llama-server: method order, pairing, and SpecChat's half on the real model (the
server half runs where a llama-server binary is named in SPECCHAT_LLAMA_SERVER)."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from engine.measure.versus_server import (
    SERVER_METHODS,
    LlamaServer,
    Run,
    first_difference,
    kind_table,
    rotations,
    run_paired,
    specchat_runner,
    summarise,
    table,
)

pytestmark = pytest.mark.slow  # SpecChat beside llama-server on the real model

METHODS = ["a", "b", "c", "d", "e"]


def test_every_method_runs_first_as_often_and_each_order_is_complete():
    orders = rotations(METHODS, rounds=2, prompts=5)
    assert len(orders) == 10 and all(sorted(o) == METHODS for o in orders)
    assert Counter(o[0] for o in orders) == {m: 2 for m in METHODS}
    assert orders[5] != orders[0]  # the next round starts elsewhere: no prompt always sees the same order


def test_ratios_pair_runs_made_back_to_back():
    """A slow round slows both methods; paired, the ratio is the same every round. The fastest runs alone
    would set a's quick round against b's quick round, which is what the medians report."""
    runs = {
        "SpecChat plain": {"p": [Run(100.0, [1, 2]), Run(50.0, [1, 2])]},
        "SpecChat lookup": {"p": [Run(150.0, [1, 2]), Run(75.0, [1, 3])]},
        "server plain": {"p": [Run(80.0, [1, 2]), Run(40.0, [1, 2])]},
    }
    s = summarise(runs)
    assert s["median_tokens_per_s"] == {"SpecChat plain": 100.0, "SpecChat lookup": 150.0, "server plain": 80.0}
    assert s["paired_vs_plain"]["SpecChat lookup"] == pytest.approx(1.5)
    assert s["lookup_paired_vs"]["server plain"] == pytest.approx(150 / 80)
    assert s["same_answer_as_plain"] == {"SpecChat plain": 1, "SpecChat lookup": 1, "server plain": 1}
    assert "| server plain | 80.0 | 0.80× | 1.88× | 1/1 |" in table(s)


def test_each_prompt_kind_is_summarised_apart_with_lookups_worst_prompt():
    """The README's rows come from the tool: per kind, the medians, their ratios (paired in brackets) and the
    prompt where lookup did worst against plain decoding."""
    speeds = {
        "copy": (100, 200, 220, 100, 250),
        "edit": (100, 120, 130, 100, 110),  # server plain, ngram, same
        "story": (100, 100, 100, 95, 90),
        "poem": (100, 100, 100, 105, 120),
    }  # cache, SpecChat plain, lookup
    kinds = {"copy": "repeating", "edit": "repeating", "story": "open", "poem": "open"}
    methods = [*SERVER_METHODS, "SpecChat plain", "SpecChat lookup"]
    runs = {m: {i: [Run(float(v[j]), [1])] for i, v in speeds.items()} for j, m in enumerate(methods)}
    s = summarise(runs, kinds)
    assert set(s["by_kind"]) == {"repeating", "open"} and s["by_kind"]["open"]["prompts"] == 2
    assert s["by_kind"]["repeating"]["lookup_worst_vs_plain"] == {"prompt": "edit", "ratio": pytest.approx(1.1)}
    assert s["by_kind"]["open"]["median_tokens_per_s"]["SpecChat lookup"] == pytest.approx(105)
    rows = kind_table(s).splitlines()
    assert rows[2].startswith("| repeating (2) | 100.0 | 100.0 | 180.0 | 1.00× (1.00×) | 1.80× (1.80×, edit 1.10×) |")
    assert rows[3].startswith("| open (2) | 100.0 | 100.0 | 105.0 | 1.00× (1.00×) | 1.05× (1.05×, story 0.95×) |")
    assert "by_kind" not in summarise(runs)  # no kinds given: one summary for the set


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_specchat_half_on_the_real_model(gemma_path):
    """Both SpecChat methods write the same greedy answer to the same prompt, one run per round each."""
    runners = {
        m: specchat_runner(str(gemma_path), method, 2)
        for m, method in (("SpecChat plain", "none"), ("SpecChat lookup", "lookup"))
    }
    items = [{"id": "copy", "prompt": "Copy this line: the cat sat on the mat. The cat sat on the mat."}]
    runs = run_paired(runners, items, rounds=2, max_tokens=12, report=lambda _line: None)
    assert [len(runs[m]["copy"]) for m in runners] == [2, 2]
    assert all(len(r.tokens) == 12 and r.tokens_per_s > 0 for rs in runs.values() for r in rs["copy"])
    s = summarise(runs)
    assert s["prompts"] == 1 and s["median_tokens_per_s"]["SpecChat plain"] > 0


SERVER = os.environ.get("SPECCHAT_LLAMA_SERVER")


@pytest.mark.skipif(not (SERVER and Path(SERVER).exists()), reason="set SPECCHAT_LLAMA_SERVER to a llama-server binary")
def test_llama_server_with_specchats_cache_settings_writes_specchats_answer(gemma_path):
    server = LlamaServer(SERVER, str(gemma_path), ["--swa-full", "--kv-unified"], threads=2)
    try:
        theirs = server.complete("The capital of France is", 16)
    finally:
        server.close()
    ours = specchat_runner(str(gemma_path), "none", 2)("The capital of France is", 16)
    assert theirs.tokens_per_s > 0 and json.dumps(theirs.tokens) == json.dumps(ours.tokens)


def test_a_pair_in_the_chat_template_on_both_sides(tmp_path):
    """--draft --chat: SpecChat's auto and draft runners decode the prompt as one user message in the template, and
    the server gets the same rendered text, with -md and --spec-type (the draft drafts nothing without it).
    SmolLM2 drafts for itself here: the same vocabulary, and small."""
    from engine.chat_format import ChatFormatter
    from engine.decoding.runtime import Model
    from engine.measure.versus_server import server_pair_methods
    from engine.modelfiles.embedded import embedded_model_path

    path = str(embedded_model_path())
    assert server_pair_methods(path)["server draft-simple"] == ["-md", path, "--spec-type", "draft-simple"]
    auto = specchat_runner(path, "auto", 2, draft=path, chat=True)("Say hello.", 6)
    plain = specchat_runner(path, "none", 2, chat=True)("Say hello.", 6)
    with Model(Path(path), vocab_only=True) as vocab:
        text = ChatFormatter(vocab).render([{"role": "user", "content": "Say hello."}])[0]
    raw = specchat_runner(path, "none", 2)(text, 6)  # the server's text, tokenized with its special tokens
    assert auto.tokens == plain.tokens == raw.tokens and len(plain.tokens) == 6


@pytest.mark.skipif(not (SERVER and Path(SERVER).exists()), reason="set SPECCHAT_LLAMA_SERVER to a llama-server binary")
def test_the_pair_comparison_runs_against_llama_server(tmp_path):
    from engine.measure.versus_server import main
    from engine.modelfiles.embedded import embedded_model_path

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "copy", "kind": "repeating", "prompt": "Repeat: one two three four."}) + "\n")
    path = str(embedded_model_path())
    assert (
        main(
            [
                "--server",
                SERVER,
                "--model",
                path,
                "--draft",
                path,
                "--chat",
                "--prompts",
                str(prompts),
                "--rounds",
                "1",
                "--max-tokens",
                "8",
                "--out",
                str(tmp_path / "out.json"),
            ]
        )
        == 0
    )
    runs = json.loads((tmp_path / "out.json").read_text())["runs"]
    assert set(runs) == {
        "server plain",
        "server draft-simple",
        "server draft-simple,ngram-simple",
        "SpecChat plain",
        "SpecChat lookup",
        "SpecChat draft",
        "SpecChat auto",
    }
    assert all(len(r["copy"][0]["tokens"]) == 8 for r in runs.values())
