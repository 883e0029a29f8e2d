"""Exact greedy (issue 52): the widest verify this build decodes bit for bit like one-row steps is measured per
model, every verify stays within it, and greedy answers are then plain decoding's token for token."""

import json

import pytest

from engine.decoding.exactness import exact_verify_rows
from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.proposers.base import NoProposer
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig
from engine.lab.bench import main as bench_main

from support.step_costs import ONE_ROW_S, pin_step_costs

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = (
    "def total(prices):\n    result = 0\n    for price in prices:\n        result += price\n    return result\n\n"
    "# The same function, with the variable renamed to amount:\ndef total(prices):\n",
    "The committee met on Tuesday to review the budget. After a long discussion, the committee",
    "Roses are red, violets are blue, sugar is sweet, and so are you. Roses are red, violets are blue,",
)


def answer(decoder, target, prompt: str, n: int = 48) -> list[int]:
    return [
        t for d in decoder.generate(target.tokenize(prompt), GREEDY, max_tokens=n, ignore_eos=True) for t in d.tokens
    ]


def test_the_exact_width_is_measured_and_rows_beyond_it_are_what_differ(target):
    start = target.next_position(0)
    tokens = target.tokenize("The quick brown fox jumps over the lazy dog.")
    width = exact_verify_rows(target, 0, start, tokens)
    assert 1 <= width <= 17
    assert target.next_position(0) == start  # the cells it used are given back


@pytest.mark.slow
def test_exact_greedy_answers_are_plain_decodings_token_for_token(target, monkeypatch):
    # step costs pinned (a wider verify a tenth dearer a row): on a loaded CI machine the timed costs made every
    # draft look unpaid, nothing was drafted, and 'it still speculated' failed; exactness is measured, not timed
    pin_step_costs(monkeypatch, one_row_s=ONE_ROW_S, extra_row_s=ONE_ROW_S / 10)
    plain = SpeculativeDecoder(target, NoProposer(), SpeculationConfig())
    exact = SpeculativeDecoder(target, LookupProposer(), SpeculationConfig(max_draft=16, exact=True))
    exact.calibrate()
    width = exact.loop.exact_rows
    assert width is not None and width >= 1
    for prompt in PROMPTS:
        assert answer(exact, target, prompt) == answer(plain, target, prompt), prompt
    widest = max(exact.loop.totals.step_time_by_rows)
    assert widest <= width, (widest, width)  # no verify was wider than measured exact
    if width > 1:
        assert exact.stats.drafted > 0 or exact.loop.totals.rows > exact.loop.totals.steps  # it still speculated


@pytest.mark.slow
def test_bench_takes_exact_and_says_the_width(tmp_path, gemma_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "copy", "prompt": PROMPTS[2]}) + "\n")
    out = tmp_path / "out.json"
    assert (
        bench_main(
            [
                "--model",
                str(gemma_path),
                "--method",
                "lookup",
                "--exact",
                "--prompts",
                str(prompts),
                "--max-tokens",
                "24",
                "--ignore-eos",
                "--threads",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["settings"]["exact"] is True and result["settings"]["exact_rows"] >= 1
    assert result["runs"][0]["speedup_vs_plain"] is not None


@pytest.mark.slow
def test_exact_ceiling_reads_the_width_and_the_curve_and_bounds_exact_mode_by_them(capsys, tmp_path, monkeypatch):
    """engine.measure.exact_ceiling: exact greedy's best case is the best rows-per-cost among widths it may verify,
    never more than the best among all widths timed."""
    import json

    from engine.measure.exact_ceiling import ceiling, main

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["--model", "embedded", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cost = {int(w): c for w, c in figures["cost"].items()}
    assert cost[1] == 1.0 and figures["exact_rows"] >= 1
    assert figures["exact_ceiling"] == ceiling(cost, figures["exact_rows"])[0] <= figures["ceiling"]
    assert ceiling({1: 1.0, 2: 1.9, 3: 2.4, 8: 4.0}, 3) == (3 / 2.4, 3)
