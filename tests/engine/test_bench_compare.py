"""engine.measure.bench_compare compares like with like: llama-cpp-python's create_completion and SpecChat's
loop count tokens the same way and follow the same end-token rule, and the output says so."""

import json
import statistics

import pytest

from engine.measure.bench_compare import main

pytestmark = pytest.mark.slow  # bench runs on the real model

# SmolLM2 answers this in a few tokens and then writes its end token (greedy: "The answer is: 4").
PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
MAX_TOKENS = 12


def compare(tmp_path, *flags: str) -> dict:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "sum", "prompt": PROMPT}) + "\n")
    out = tmp_path / "out.json"
    assert (
        main(
            [
                "--model",
                "embedded",
                "--prompts",
                str(prompts),
                "--max-tokens",
                str(MAX_TOKENS),
                "--threads",
                "2",
                "--out",
                str(out),
                *flags,
            ]
        )
        == 0
    )
    return json.loads(out.read_text())


def generated(row: dict) -> dict[str, int]:
    return {side: row[side + "_detail"]["generated"] for side in ("llama-cpp-python", "none", "lookup")}


def test_with_ignore_eos_both_sides_decode_exactly_max_tokens(tmp_path, capsys):
    result = compare(tmp_path, "--ignore-eos")
    (row,) = result["rows"]
    assert generated(row) == {"llama-cpp-python": MAX_TOKENS, "none": MAX_TOKENS, "lookup": MAX_TOKENS}
    assert "end tokens ignored on both sides" in result["compared"]
    assert result["compared"] in capsys.readouterr().out


def test_without_it_both_sides_stop_at_the_end_token(tmp_path):
    result = compare(tmp_path)
    (row,) = result["rows"]
    counts = generated(row)
    assert counts["llama-cpp-python"] < MAX_TOKENS and row["llama-cpp-python_detail"]["finish_reason"] == "stop"
    assert row["none_detail"]["finish_reason"] == "stop" == row["lookup_detail"]["finish_reason"]
    assert len(set(counts.values())) == 1, counts  # the same greedy answer, counted alike
    assert "both stop at the first end token" in result["compared"]


def test_every_method_takes_every_place_in_the_order_in_turn():
    """A fixed order biased the comparison (the third method read 0.97x the first on the same plain decode)."""
    from engine.measure.bench_compare import rotated

    methods = ["none", "lookup", "draft", "auto"]
    orders = [rotated(methods, turn) for turn in range(4)]
    assert all(sorted(order) == sorted(methods) for order in orders)
    assert [order.index("draft") for order in orders] == [2, 1, 0, 3]


def test_plain_decoding_runs_beside_every_method_and_each_is_compared_with_its_neighbours():
    """The machine's speed wanders over seconds: each method is compared with the plain runs either side of it."""
    from engine.measure.bench_compare import bracketed, median_ratio

    orders = [bracketed(["none", "lookup", "auto"], turn) for turn in range(2)]
    assert orders == [["none", "lookup", "none", "auto", "none"], ["none", "auto", "none", "lookup", "none"]]
    rows = [
        {"none": 20.0, "lookup": 30.0, "plain_beside": {"lookup": 30.0}},
        {"none": 25.0, "lookup": 25.0},
    ]  # a row from before bracketing: its one plain run
    assert median_ratio(rows, "lookup", "none") == 1.0


def test_seeds_run_every_prompt_once_each_and_the_kinds_get_a_geomean(tmp_path, capsys):
    """The multi-seed figure of the benchmarks: each prompt once per seed, only the methods asked for, and per kind
    the geomean over prompts of each prompt's median ratio to plain decoding."""
    import pytest

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": name, "kind": kind, "prompt": PROMPT.replace("2+2", sum_)}) + "\n"
            for name, kind, sum_ in (("a", "edits", "2+2"), ("b", "edits", "3+5"), ("c", "open", "7+1"))
        )
    )
    out = tmp_path / "out.json"
    assert (
        main(
            [
                "--model",
                "embedded",
                "--prompts",
                str(prompts),
                "--max-tokens",
                "8",
                "--threads",
                "2",
                "--temperature",
                "0.8",
                "--seeds",
                "1-2",
                "--methods",
                "lookup",
                "--no-reference",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert [(r["id"], r["seed"]) for r in result["rows"]] == [
        ("a", 1),
        ("a", 2),
        ("b", 1),
        ("b", 2),
        ("c", 1),
        ("c", 2),
    ]
    assert all(
        set(r) - {"id", "seed"} == {"none", "none_detail", "lookup", "lookup_detail", "plain_beside", "plain_runs"}
        and len(r["plain_runs"]) == 2
        for r in result["rows"]
    )
    assert "seeds 1, 2" in result["compared"] and "create_completion" not in result["compared"]  # not run
    medians = {
        i: statistics.median(
            r["lookup"] / statistics.geometric_mean(r["plain_runs"]) for r in result["rows"] if r["id"] == i
        )
        for i in "abc"
    }
    assert result["by_kind"]["edits"]["lookup"] == pytest.approx(
        statistics.geometric_mean([medians["a"], medians["b"]])
    )
    assert result["by_kind"]["open"]["lookup"] == pytest.approx(medians["c"])
    assert "edits: lookup" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # greedy answers do not depend on a seed
        main(["--model", "embedded", "--prompts", str(prompts), "--seeds", "1-2", "--no-reference"])
    with pytest.raises(SystemExit):  # auto needs a draft model
        main(["--model", "embedded", "--prompts", str(prompts), "--methods", "auto", "--no-reference"])
