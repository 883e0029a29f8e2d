"""python -m engine.serve_bench: it starts plain and lookup servers itself, sends concurrent streaming
clients, and writes results, a table and a plot from what it measured (the real embedded SmolLM2)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_spawns_servers_and_reports_every_cell(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": text}) for i, text in enumerate(
        ["Repeat exactly: red, green, blue, red, green, blue.", "List the days of the week."])))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "engine.serve_bench", "--methods", "none,lookup", "--clients", "1,2",
                          "--requests", "1", "--repeats", "1", "--max-tokens", "12", "--ctx", "1024",
                          "--prompts", str(prompts), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((out / "results.json").read_text())
    cells = {(c["method"], c["clients"]): c for c in results["cells"]}
    assert set(cells) == {("none", 1), ("none", 2), ("lookup", 1), ("lookup", 2)}
    for cell in cells.values():
        assert not cell["errors"] and cell["requests"] == cell["clients"]
        assert 0 < cell["completion_tokens"] <= 12 * cell["clients"] and cell["aggregate_tokens_per_s"] > 0
        assert cell["ttft_p50_s"] > 0 and cell["itl_p50_s"] > 0 and cell["itl_p95_s"] >= cell["itl_p50_s"]
    assert cells[("none", 1)]["mean_acceptance_length"] == 1.0
    summary = (out / "summary.md").read_text()
    assert "| 2 | lookup |" in summary and "vs plain" in summary
    assert (out / "plot.png").stat().st_size > 10_000
