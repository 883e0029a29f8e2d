"""python -m engine.serve_bench: it starts plain and lookup servers itself, sends concurrent streaming
clients, and writes results, a table and a plot from what it measured (the real embedded SmolLM2)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the load bench spawns servers

ROOT = Path(__file__).resolve().parents[2]


def test_bench_spawns_servers_and_reports_every_cell(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"id": f"p{i}", "prompt": text})
            for i, text in enumerate(
                ["Repeat exactly: red, green, blue, red, green, blue.", "List the days of the week."]
            )
        )
    )
    out = tmp_path / "out"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.serve_bench",
            "--methods",
            "none,lookup",
            "--clients",
            "1,2",
            "--requests",
            "1",
            "--repeats",
            "1",
            "--max-tokens",
            "12",
            "--ctx",
            "1024",
            "--prompts",
            str(prompts),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((out / "results.json").read_text())
    cells = {(c["method"], c["clients"]): c for c in results["cells"]}
    assert set(cells) == {("none", 1), ("none", 2), ("lookup", 1), ("lookup", 2)}
    for cell in cells.values():
        assert not cell["errors"] and cell["requests"] == cell["clients"]
        assert 0 < cell["completion_tokens"] <= 12 * cell["clients"] and cell["aggregate_tokens_per_s"] > 0
        assert cell["ttft_p50_s"] > 0 and cell["itl_p50_s"] > 0 and cell["itl_p95_s"] >= cell["itl_p50_s"]
    assert cells[("none", 1)]["mean_acceptance_length"] is None  # plain decoding makes no drafts
    summary = (out / "summary.md").read_text()
    assert "| 2 | lookup |" in summary and "vs plain" in summary
    assert (out / "plot.png").stat().st_size > 10_000


def test_full_load_counts_what_streamed_while_every_client_was_being_answered():
    from engine.lab.serve_cell import RequestTrace, full_load_rate

    a = RequestTrace(0.0, first_at=1.0, done_at=3.0, chunks=[(1.0, 1), (2.0, 2), (3.0, 3)], completion_tokens=3)
    b = RequestTrace(0.5, first_at=1.5, chunks=[(1.5, 1), (2.5, 2), (4.0, 3)])  # cut short: answering until the end
    # both answered from 1.5 (b's first token: its prefill before it is left out) to 3.0 (a ended): a's tokens at
    # 2.0 and 3.0 and b's at 2.5, over 1.5 s; b's token at 4.0 came with one client left
    assert full_load_rate([a, b], end=5.0) == pytest.approx(3 / 1.5)
    # a server that answers one at a time (c waits for a): one answered is its full load, c's prefill left out
    c = RequestTrace(0.0, first_at=3.5, done_at=4.5, chunks=[(3.5, 1), (4.0, 2), (4.5, 3)], completion_tokens=3)
    assert full_load_rate([a, c], end=5.0) == pytest.approx(4 / 3.0)  # a's 1..3 and c's 3.5..4.5
    assert full_load_rate([RequestTrace(0.0)], end=1.0) is None  # nothing answered
