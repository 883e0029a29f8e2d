"""Startup and saving when the disk does not cooperate: the window opens, nothing raises into the UI,
and every problem is told in a notice."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtNetwork import QLocalServer

from app.settings.values import load_settings
from app.single_instance import hand_over, instance_name

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_saving_never_raises_into_the_window(make_window, dirs, monkeypatch):
    window = make_window()
    window.apply_settings(window.settings.merged({"system_prompt": "half an emoji: \ud83d"}))
    assert load_settings()[0].system_prompt == "half an emoji: \ud83d"  # saved as typed
    assert not any("could not be saved" in t for t in window.notices.texts())

    blocker = dirs / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(blocker / "config"))  # as a vanished or unwritable folder
    window.apply_settings(window.settings.merged({"system_prompt": "kept until quit"}))
    assert window.settings.system_prompt == "kept until quit"
    assert any(t.startswith("Settings could not be saved (") for t in window.notices.texts())


@pytest.mark.slow
def test_the_app_starts_when_its_folders_cannot_be_written(tmp_path, qapp, qtbot, gemma_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        SPECCHAT_CONFIG_DIR=str(blocker / "config"),
        SPECCHAT_DATA_DIR=str(blocker / "data"),
    )  # mkdir fails in both: NotADirectoryError
    env.pop("SPECCHAT_CACHE_DIR", None)
    log_path = tmp_path / "app.log"
    with open(log_path, "wb") as log:
        app = subprocess.Popen([sys.executable, "-m", "app"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
    name = instance_name(blocker / "data")
    try:
        deadline = time.monotonic() + 120
        while "come forward" not in log_path.read_text():  # running, with its window, and answering
            assert app.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            hand_over(name, {})
            time.sleep(0.5)
        text = log_path.read_text()
        assert f"Conversations will not be saved: {blocker / 'data'} is not writable (Not a directory)" in text
        assert f"Settings will not be saved: {blocker / 'config'} is not writable (Not a directory)" in text
        assert "Traceback" not in text
    finally:
        app.terminate()
        app.wait(30)
        QLocalServer.removeServer(name)
    assert blocker.read_text() == "not a folder"
