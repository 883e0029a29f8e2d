"""Chat templates are untrusted code: one that loops, takes gigabytes or writes megabytes is refused within
engine/template_sandbox.py's limits, by the model check's probe, the chat formatter, `python -m
engine.chat_format`; a normal one renders exactly as llama-cpp-python renders it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from engine import template_sandbox
from engine.chat_format import ChatFormatter
from engine.decoding.runtime import LoadSettings, Model
from engine.errors import EngineError
from engine.modelfiles import model_check
from engine.modelfiles.model_check import check_model_file
from engine.template_sandbox import MEMORY_LIMIT_BYTES, TIME_LIMIT_S, TemplateRefused, TemplateSandbox

from support.hostile_templates import CHATML, HELLO, HOGS, HOSTILE, SPINS, hostile_gguf, tree_rss

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sandbox():
    box = TemplateSandbox()
    yield box
    box.close()


def test_a_normal_template_renders_as_llama_cpp_python_renders_it(sandbox):
    conversation = [*HELLO, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "ünïcode ✓ " * 50}]
    direct = Jinja2ChatFormatter(template=CHATML, eos_token="</s>", bos_token="<s>")(messages=conversation).prompt
    assert sandbox.render(CHATML, conversation, bos="<s>", eos="</s>") == direct
    # A template that rejects a conversation is that conversation's error, not a refusal of the template.
    with pytest.raises(EngineError, match="rejected this conversation: no system role") as refused:
        sandbox.render("{{ raise_exception('no system role') }}", HELLO)
    assert not isinstance(refused.value, TemplateRefused)


class WatchClock:
    """The sandbox's time.monotonic, one second later at each read: the render's deadline is read first, then once
    each watch (WATCH_EVERY_S) that found no reply, so the time limit passes at a known watch whatever the load."""

    def __init__(self) -> None:
        self.reads: list[float] = []

    def monotonic(self) -> float:
        self.reads.append(float(len(self.reads)))
        return self.reads[-1]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_each_hostile_template_is_refused_within_the_limits_and_the_sandbox_lives_on(sandbox, name, monkeypatch):
    sandbox.render(CHATML, HELLO)  # the child that renders the hostile one is up
    child, before, clock = sandbox._proc, tree_rss(), WatchClock()
    peak = before
    if name.startswith("spins"):  # the time limit's cases: watched on a clock of the test's own
        monkeypatch.setattr(template_sandbox, "time", SimpleNamespace(monotonic=clock.monotonic))
    with pytest.raises(TemplateRefused) as refused:
        sandbox.render(HOSTILE[name], HELLO)
    monkeypatch.undo()  # the real clock again, for the render below
    peak = max(peak, tree_rss())
    if name.startswith("spins"):
        # Stopped at the first watch past the limit (the deadline read at 0 s), not before, and killed, not left
        # to spin: a render the watch let run on would die of its own alarm (a lost child, not this reason).
        assert clock.reads == [float(s) for s in range(int(TIME_LIMIT_S) + 2)], clock.reads
        assert child is not None and child.wait(60) == -signal.SIGKILL
    assert peak - before < MEMORY_LIMIT_BYTES + (256 << 20)
    reason = refused.value.reason
    expected = {
        "spins": "took over 3 s",
        "spins writing": "took over 3 s",
        "hogs memory": "512 MB of memory",
        "centres": "512 MB of memory",
        "writes megabytes": "characters for",
        "recurses": "recursed",
        "escapes": "sandbox forbids",
        "unreadable": "could not be read",
    }[name]
    assert expected in reason, reason
    assert sandbox.render(CHATML, HELLO).endswith("<|im_start|>assistant\n")  # the next render is served


@pytest.mark.slow
def test_the_model_check_probe_refuses_a_hostile_template_and_remembers_why(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    fine = hostile_gguf(tmp_path / "fine.gguf", CHATML, complete=True)
    spins = hostile_gguf(tmp_path / "spins.gguf", SPINS, complete=True)
    assert check_model_file(fine) is None
    checks = []  # each child the check started (the probe renders in it)
    real_check = model_check._check_in_child
    monkeypatch.setattr(model_check, "_check_in_child", lambda *a: checks.append(a) or real_check(*a))
    monkeypatch.setattr(model_check, "CHECK_TIMEOUT_S", 60.0)  # a liveness guard: the probe's own limit is 3 s
    assert "took over 3 s" in check_model_file(spins)  # the probe's refusal, not the check's 60 s one
    assert "took over 3 s" in check_model_file(spins, vocab_only=True)  # remembered: no second probe
    assert checks == [(spins, False)], checks


@pytest.mark.slow
def test_a_refused_template_gives_way_to_the_family_format_its_control_tokens_match(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    # Refused by the probe: known from the start, and said by the loader (template_error), not by a prompt.
    path = hostile_gguf(tmp_path / "hogs.gguf", HOGS)
    with Model(path, LoadSettings(n_gpu_layers=0), vocab_only=True) as model:
        model.n_ctx = 256
        formatter = ChatFormatter(model)
        assert not formatter.uses_template  # ChatML instead: the prompt below is what chat_format="chatml" writes
        assert "hogs.gguf was refused" in formatter.template_error and "512 MB" in formatter.template_error
        prompt = formatter.prompt([{"role": "user", "content": "w1 w2"}], reserve=8)
        # As llama-cpp-python's chat_format="chatml" writes it (an empty system turn included).
        assert prompt.text == (
            "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nw1 w2<|im_end|>\n<|im_start|>assistant\n"
        )
        assert [model.token_text(t) for t in prompt.tokens if model.token_text(t).startswith(b"<|")] == [
            b"<|im_start|>",
            b"<|im_end|>",
            b"<|im_start|>",
            b"<|im_end|>",
            b"<|im_start|>",
        ]
        assert prompt.stop == ("</s>", "<|im_end|>") and not prompt.notices
    # Refused while rendering (the probe's conversation passed): said once, with the first prompt.
    path = hostile_gguf(
        tmp_path / "no-family.gguf",
        CHATML.replace("{% endfor %}", "{% if 'w9' in m['content'] %}" + SPINS + "{% endif %}{% endfor %}"),
        control=[],
    )
    with Model(path, LoadSettings(n_gpu_layers=0), vocab_only=True) as model:
        model.n_ctx = 256
        formatter = ChatFormatter(model)
        assert formatter.uses_template
        assert formatter.prompt([{"role": "user", "content": "w1"}], reserve=8).uses_template
        prompt = formatter.prompt([{"role": "user", "content": "w9"}], reserve=8)
        assert not prompt.uses_template and prompt.text.endswith("User: w9\nAssistant:")  # no family: plain
        assert len(prompt.notices) == 1 and "took over 3 s" in prompt.notices[0]
        assert not formatter.prompt([{"role": "user", "content": "w9"}], reserve=8).notices


def run_chat_format_measured(model: Path, messages: Path) -> tuple[subprocess.CompletedProcess, int]:
    """python -m engine.chat_format, and the largest resident size of it or any process it started."""
    script = textwrap.dedent(f"""
        import resource, subprocess, sys
        done = subprocess.run([sys.executable, "-m", "engine.chat_format", "--model", {str(model)!r},
                               "--messages", {str(messages)!r}], capture_output=True, text=True, timeout=120)
        print(done.returncode)
        print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        sys.stderr.write(done.stderr)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180)
    code, max_kb = done.stdout.split()
    return subprocess.CompletedProcess(done.args, int(code), "", done.stderr), int(max_kb) * 1024


@pytest.mark.slow
@pytest.mark.parametrize("name", ["spins", "hogs memory"])
def test_engine_chat_format_ends_with_a_clear_error_on_a_hostile_template(tmp_path, name):
    model = hostile_gguf(tmp_path / "hostile.gguf", HOSTILE[name])
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "user", "content": "w1 w2"}]))
    done, peak = run_chat_format_measured(model, messages)  # (ended by its own timeouts, 120 s, should it hang)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: The chat template in hostile.gguf was refused"), lines
    assert ("took over 3 s" if name == "spins" else "512 MB") in lines[0] and "ChatML" in lines[0]
    assert peak < 1 << 30, peak
