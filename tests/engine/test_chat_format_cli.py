"""python -m engine.chat_format, run as a real subprocess: the prompt a model reads, and clear refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.chat_formats import CHATML_FORGERY, GEMMA_FORGERY, SMOLLM2_MISSING, smollm2_path

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine.chat_format", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def messages_file(tmp_path, messages) -> Path:
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(messages))
    return path


@pytest.mark.slow
def test_embedded_model_prints_the_fallback_transcript_and_its_tokens(tmp_path, gemma_path):
    done = run_cli(
        "--model",
        "embedded-gemma",
        "--messages",  # the base model: no template, the fallback
        messages_file(tmp_path, [{"role": "user", "content": GEMMA_FORGERY}]),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["model"] == str(gemma_path) and report["uses_template"] is False
    assert report["stop"] == ["\nUser:", "\nAssistant:"]
    assert report["text"].endswith("User: " + GEMMA_FORGERY + "\nAssistant:")
    tokens = report["tokens"]
    assert report["n_tokens"] == len(tokens) and tokens[0] == {"id": 2, "piece": "<bos>", "special": True}
    assert [t for t in tokens if t["special"]] == tokens[:1]  # the pasted turn markers stayed text
    assert "".join(t["piece"] for t in tokens[1:]) == report["text"]


@pytest.mark.slow
def test_smollm2_prints_its_template_prompt_with_control_tokens_marked(tmp_path):
    path = smollm2_path() or pytest.skip(SMOLLM2_MISSING)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": CHATML_FORGERY}]
    done = run_cli("--model", path, "--messages", messages_file(tmp_path, messages))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["uses_template"] is True and report["template_error"] is None
    assert report["stop"] == ["<|im_end|>"]
    assert report["text"] == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        + CHATML_FORGERY
        + "<|im_end|>\n<|im_start|>assistant\n"
    )
    special = [t["piece"] for t in report["tokens"] if t["special"]]
    assert special == ["<|im_start|>", "<|im_end|>"] * 2 + ["<|im_start|>"]  # the template's, not the paste's
    assert "".join(t["piece"] for t in report["tokens"]) == report["text"]
    assert '\n    {"id": 1, "piece": "<|im_start|>", "special": true},\n' in done.stdout  # one token a line


def bad_inputs(tmp_path):
    good = messages_file(tmp_path, [{"role": "user", "content": "Hi"}])
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_bytes(b"these are my notes, not a model\n" * 64)
    files = {name: tmp_path / f"{name}.json" for name in ("broken", "object", "no_content", "bad_role")}
    files["broken"].write_text('[{"role": "user", "content": ')
    files["object"].write_text('{"role": "user", "content": "Hi"}')
    files["no_content"].write_text('[{"role": "user"}]')
    files["bad_role"].write_text('[{"role": "robot", "content": "beep"}]')
    return {
        "missing model": (["--model", tmp_path / "nowhere.gguf", "--messages", good], "not found"),
        "not GGUF": (["--model", not_gguf, "--messages", good], "is not a GGUF model"),
        "missing messages": (["--model", "embedded", "--messages", tmp_path / "none.json"], "Cannot read"),
        "malformed JSON": (["--model", "embedded", "--messages", files["broken"]], "is not valid JSON"),
        "not a list": (["--model", "embedded", "--messages", files["object"]], "must hold a JSON list"),
        "no content": (["--model", "embedded", "--messages", files["no_content"]], "Malformed chat message"),
        "unknown role": (["--model", "embedded", "--messages", files["bad_role"]], "Malformed chat message"),
    }


@pytest.mark.slow
def test_bad_input_is_one_line_on_stderr_and_exit_code_2(tmp_path):
    for case, (args, says) in bad_inputs(tmp_path).items():
        done = run_cli(*args)
        assert done.returncode == 2, (case, done.stderr)
        assert done.stdout == "" and "Traceback" not in done.stderr, case
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], (case, done.stderr)
