"""One SpecChat per data folder: a second launch hands its request to the first and quits, so two
never share (or "recover") one conversation file."""

import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtNetwork import QLocalServer

from app.conversations.store import FILE_NAME
from app.settings.values import AppSettings, save_settings
from app.single_instance import claim, hand_over, instance_name

from support.children import ROOT, child_env

pytestmark = pytest.mark.slow  # two launches in child processes


def newest_user_message(db_path):
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)
    try:
        row = db.execute("SELECT content FROM messages WHERE role='user' ORDER BY id DESC LIMIT 1").fetchone()
        return row and row[0]
    except sqlite3.Error:  # not created yet
        return None
    finally:
        db.close()


def test_a_second_launch_hands_over_to_the_first_and_exits(dirs, gemma_path):
    save_settings(AppSettings(max_tokens=4, threads=1, n_ctx=512))  # the forwarded message gets a short answer
    db_path = dirs / "data" / FILE_NAME
    first_log = dirs / "first.log"
    with open(first_log, "wb") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "app"], cwd=ROOT, env=child_env(dirs), stdout=subprocess.DEVNULL, stderr=log
        )
    try:
        deadline = time.monotonic() + 120
        while not db_path.exists():  # the store opens after the instance is claimed
            assert first.poll() is None and time.monotonic() < deadline, first_log.read_text()[-2000:]
            time.sleep(0.2)

        second = subprocess.run(  # -X importtime: every module it imports, in its stderr
            [sys.executable, "-X", "importtime", "-m", "app", "--send", "Hello from a second launch"],
            cwd=ROOT,
            env=child_env(dirs),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 0, second.stderr[-2000:]
        imported = {line.rsplit("|", 1)[1].strip() for line in second.stderr.splitlines() if "import time:" in line}
        assert "app.single_instance" in imported  # what it does: hand over
        assert not imported & {"app.main_window", "llama_cpp", "app.conversations.store"}  # no window, model, store
        assert "already running" in second.stderr

        while not (
            "another launch asked SpecChat to come forward" in first_log.read_text()
            and newest_user_message(db_path) == "Hello from a second launch"
        ):  # the first sent it
            assert first.poll() is None and time.monotonic() < deadline, first_log.read_text()[-2000:]
            time.sleep(0.2)
        assert "cut off" not in first_log.read_text() + second.stderr
    finally:
        first.terminate()
        first.wait(30)
        QLocalServer.removeServer(instance_name(dirs / "data"))  # terminated: its socket file stays behind


@pytest.mark.skipif(sys.platform == "win32", reason="a Unix socket file")
def test_a_socket_left_by_a_crash_does_not_block_the_next_launch(qapp, qtbot, tmp_path):
    from PySide6.QtCore import QDir

    name = instance_name(tmp_path / "data")
    assert name != instance_name(tmp_path / "other")  # a smoke test's scratch folder is never blocked
    stale = Path(QDir.tempPath()) / name  # where Qt puts the socket on Unix
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))  # as a killed SpecChat leaves it: the file, and nobody listening
    leftover.close()
    try:
        server = claim(name, {})
        assert server is not None and server.is_listening()
        with qtbot.waitSignal(server.requested, timeout=5000) as request:
            assert hand_over(name, {"send": "hi"})
        assert request.args == [{"send": "hi"}]
        server.close()
    finally:
        stale.unlink(missing_ok=True)
