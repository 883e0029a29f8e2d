"""Exact greedy through the window (issue 52): Settings → "Exact greedy" reaches the engine, and a greedy answer
with it is plain decoding's word for word; the smoke test takes --exact and says so on its line."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from support.children import ROOT, child_env
from support.window import PASSAGE

pytestmark = pytest.mark.slow  # smoke tests in child processes


def set_in_settings(window, qtbot, **checks):
    """Open Model → Settings…, set the check boxes named, press OK (as a person does)."""

    def fill():
        dialog = QApplication.activeModalWidget()
        for name, on in checks.items():
            getattr(dialog, name).setChecked(on)
        dialog.accept()

    QTimer.singleShot(0, fill)
    window.tools.open_settings()
    qtbot.waitUntil(lambda: not window.session.busy, timeout=60_000)


def ask(window, qtbot, wait_response, text: str) -> str:
    window.new_chat()
    window.input.setPlainText(text)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    reply = wait_response(window)
    assert reply.status == "done", reply.status
    return reply.content


def test_exact_greedy_set_in_settings_answers_as_plain_decoding_does(make_window, qtbot, wait_response, quick_settings):
    window = make_window(replace(quick_settings, max_tokens=48, method="lookup"))
    set_in_settings(window, qtbot, exact_greedy=True)
    assert window.settings.exact_greedy
    qtbot.waitUntil(lambda: window.engine.worker.decoder.loop.speculation.exact, timeout=60_000)
    exact = ask(window, qtbot, wait_response, PASSAGE)
    assert window.session.model.items[-1].stats["drafted"] >= 0
    set_in_settings(window, qtbot, speculation=False)
    plain = ask(window, qtbot, wait_response, PASSAGE)
    assert exact == plain


def test_the_smoke_test_runs_exact_greedy(dirs):
    result = subprocess.run(
        [sys.executable, "-m", "app", "--smoke-test", "--exact"],
        cwd=ROOT,
        env=child_env(dirs),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["exact_greedy"] is True and "Point Arden" in line["text"]
    refused = subprocess.run(
        [sys.executable, "-m", "app", "--exact"],
        cwd=ROOT,
        env=child_env(dirs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0 and "--exact goes with --smoke-test" in refused.stderr
