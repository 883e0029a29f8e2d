"""python -m engine.bench as a real subprocess on the embedded SmolLM2: the sampling flags, --repeats
and --chat are recorded, and --chat really sends the prompt through the model's chat template."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.chat_format import ChatFormatter
from engine.decoding.runtime import Model
from engine.modelfiles.embedded import embedded_model_path

pytestmark = pytest.mark.slow  # a bench run from the command line

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = {"capital": "What is the capital of France?", "count": "Count from one to five."}


def test_bench_records_sampling_repeats_and_the_chat_template(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": k, "prompt": v}) + "\n" for k, v in PROMPTS.items()))
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.bench",
            "--model",
            "embedded",
            "--method",
            "lookup",
            "--max-tokens",
            "8",
            "--top-k",
            "5",
            "--top-p",
            "0.9",
            "--min-p",
            "0.05",
            "--temperature",
            "0.8",
            "--seed",
            "3",
            "--repeats",
            "2",
            "--chat",
            "--threads",
            "2",
            "--prompts",
            str(prompts),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())

    vocab = Model(embedded_model_path(), vocab_only=True)
    try:
        formatter = ChatFormatter(vocab)
        chat_tokens = {k: formatter.render([{"role": "user", "content": v}])[1] for k, v in PROMPTS.items()}
        raw_tokens = {k: vocab.tokenize(v) for k, v in PROMPTS.items()}
        stops = list(formatter.render([{"role": "user", "content": "x"}])[2])
    finally:
        vocab.close()

    settings = result["settings"]
    assert {k: settings[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed", "repeats", "chat")} == {
        "temperature": 0.8,
        "top_k": 5,
        "top_p": 0.9,
        "min_p": 0.05,
        "seed": 3,
        "repeats": 2,
        "chat": True,
    }
    assert settings["chat_template"] == "model" and settings["stop"] == stops

    assert [run["id"] for run in result["runs"]] == list(PROMPTS)
    for run in result["runs"]:
        assert run["repeats"] == 2 and [r["repeat"] for r in run["every_run"]] == [0, 1]
        assert all(r["id"] == run["id"] for r in run["every_run"])
        # The kept run is one of the two, the one with the faster decode.
        assert {k: v for k, v in run.items() if k not in ("repeats", "every_run")} in run["every_run"]
        assert (run["decode_tokens_per_s"] or 0.0) == max(r["decode_tokens_per_s"] or 0.0 for r in run["every_run"])
        for r in run["every_run"]:  # the prompt went in through the template, not as raw text
            assert r["prompt_tokens"] == len(chat_tokens[run["id"]]) != len(raw_tokens[run["id"]])
            assert 1 <= len(r["tokens"]) <= 8
