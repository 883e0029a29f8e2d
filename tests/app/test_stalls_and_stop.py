"""An answer that stalls says so under it; Stop always ends it in the window; a model whose chat template
spins still gets answered (in the format its control tokens match), with a notice naming the template; and
`--smoke-test --use-settings` answers with the model the user chose."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

import app.chat.response as chat_response
from app.settings.values import AppSettings, save_settings
from engine.modelfiles.embedded import EMBEDDED_GEMMA
from engine.template_sandbox import TemplateSandbox

from support.hostile_templates import hostile_gguf
from support.serving import SPINS_ON_W9

pytestmark = pytest.mark.slow  # stuck engines and spinning templates in the window

ROOT = Path(__file__).resolve().parents[2]


def send(window, qtbot, text: str) -> None:
    window.input.setPlainText(text)
    qtbot.mouseClick(window.send_button, Qt.MouseButton.LeftButton)


def test_a_spinning_template_shows_a_stall_then_the_answer_comes_in_its_family_format(
    make_window, qtbot, dirs, monkeypatch
):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(dirs / "cache"))
    monkeypatch.setattr(chat_response, "STALL_AFTER_S", 1.0)
    path = hostile_gguf(dirs / "spins-on-w9.gguf", SPINS_ON_W9, complete=True)
    window = make_window(AppSettings(model=str(path), temperature=0.0, max_tokens=4, n_ctx=256, threads=1))
    send(window, qtbot, "w9")  # the probe's conversation passed; this one spins until the sandbox stops it
    stalled = []
    qtbot.waitUntil(
        lambda: stalled.append(window.view.widget_for(1).notice.text()) or not window.session.busy, timeout=60_000
    )
    assert any(t.startswith("No text yet after") and "Stop ends it" in t for t in stalled), stalled
    answer = window.session.model.items[-1]
    assert answer.status == "done" and "No text yet" not in answer.notice  # the stall notice went with the wait
    refused = [t for t in window.notices.texts() if "spins-on-w9.gguf was refused" in t]
    assert refused and "took over 3 s" in refused[0] and "ChatML" in refused[0]
    asked = []  # what the sandbox is asked from now on
    real_ask = TemplateSandbox._ask
    monkeypatch.setattr(TemplateSandbox, "_ask", lambda self, request: asked.append(request) or real_ask(self, request))
    send(window, qtbot, "w9 again")  # no second wait: the template is not used again
    qtbot.waitUntil(lambda: not window.session.busy, timeout=60_000)
    assert window.session.model.items[-1].status == "done" and asked == []  # the sandbox was not asked again


def test_stop_ends_the_answer_in_the_window_even_when_the_engine_is_stuck(make_window, qtbot, monkeypatch):
    """The engine honours Stop within a step; this makes it ignore Stop (as native code that never returns
    would), so only the window's own grace period can end the answer."""
    window = make_window()
    decoder = window.engine.worker.decoder
    stuck, release, left = threading.Event(), threading.Event(), threading.Event()

    def never_stops(*args, **kwargs):
        stuck.set()
        release.wait(180)  # only the test ends this (or a guard long after the test's own wait gave up)
        left.set()
        yield from ()

    monkeypatch.setattr(decoder, "generate", never_stops)
    send(window, qtbot, "Count to ten.")
    qtbot.waitUntil(stuck.is_set, timeout=30_000)
    qtbot.mouseClick(window.send_button, Qt.MouseButton.LeftButton)  # the button reads Stop now
    qtbot.waitUntil(lambda: not window.session.busy, timeout=60_000)
    assert not left.is_set()  # the window ended the answer while the engine was still stuck
    answer = window.session.model.items[-1]
    assert answer.status == "stopped" and "did not stop within" in answer.notice
    assert window.send_button.text() == "Send"
    release.set()  # the engine finishes late: its answer is ignored, the next one is served
    monkeypatch.undo()
    send(window, qtbot, "Say hello.")
    qtbot.waitUntil(lambda: not window.session.busy, timeout=120_000)
    assert window.session.model.items[-1].status == "done"
    assert window.session.model.items[-3].status == "stopped"  # the stuck answer kept as it was


def test_smoke_test_with_use_settings_answers_with_the_saved_model(dirs):
    # Plain decoding: the saved settings are what is checked, and so Gemma's steps are not timed (~18 s on a fresh
    # cache) for a 12-token answer.
    save_settings(
        AppSettings(model=EMBEDDED_GEMMA, temperature=0.0, max_tokens=12, n_ctx=1024, threads=2, speculation=False)
    )
    saved = (dirs / "config" / "settings.json").read_text()
    env = dict(
        __import__("os").environ,
        QT_QPA_PLATFORM="offscreen",
        SPECCHAT_CONFIG_DIR=str(dirs / "config"),
        SPECCHAT_DATA_DIR=str(dirs / "data"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "app", "--smoke-test", "--use-settings", "--prompt", "The sky is"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["model"].lower().startswith("gemma") and out["generated"] <= 12  # the saved model and limit
    assert out["method"] == "none"  # and the saved speculation setting
    assert (dirs / "config" / "settings.json").read_text() == saved  # read, never written
    refused = subprocess.run(
        [sys.executable, "-m", "app", "--use-settings"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "--use-settings goes with --smoke-test" in refused.stderr
