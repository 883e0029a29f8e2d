"""The app and damaged or unusual model files, as a user meets them: a saved damaged model does not
crash every launch, a crash while loading is not repeated at the next start, and a recurrent model
chats without speculation and says why."""

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from app.settings.values import AppSettings, load_settings, save_settings
from engine.modelfiles.embedded import embedded_model_path

from support.children import ROOT, child_env
from support.damaged_models import with_duplicate_token, write_tiny_mamba


def launch(dirs) -> subprocess.Popen:
    env = dict(child_env(dirs), GGML_NO_BACKTRACE="1")
    return subprocess.Popen(
        [sys.executable, "-m", "app"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_saved_damaged_model_does_not_crash_the_launch(dirs):
    bad, _ = with_duplicate_token(embedded_model_path(), dirs / "damaged.gguf")
    (dirs / "config").mkdir()
    save_settings(AppSettings(model=str(bad), threads=2), dirs / "config" / "settings.json")
    log = dirs / "data" / "specchat.log"
    child = launch(dirs)
    try:
        wait_for(lambda: log.exists() and "twice in its vocabulary" in log.read_text(), 120, "the refusal in the log")
        time.sleep(0.5)
        assert child.poll() is None, f"SpecChat exited with {child.returncode}"
    finally:
        child.terminate()
        child.wait(30)


@pytest.mark.slow
def test_a_crash_while_loading_is_not_repeated_at_the_next_start(dirs, make_window, quick_settings):
    mine = dirs / "my-model.gguf"
    shutil.copyfile(embedded_model_path(), mine)  # the user's own file, which (let us say) crashes SpecChat
    (dirs / "config").mkdir()
    save_settings(replace(quick_settings, model=str(mine)), dirs / "config" / "settings.json")
    marker = dirs / "data" / "loading.json"
    child = launch(dirs)
    try:
        wait_for(marker.exists, 120, "the load to start")
        child.send_signal(signal.SIGKILL)  # dies mid-load, as an abort or an out-of-memory kill would
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert marker.exists(), "the killed launch left its note"
    settings, _ = load_settings()
    window = make_window(settings)  # the next launch: waits until a model is loaded
    assert window.settings.model == "embedded"
    assert load_settings()[0].model == "embedded"  # and so for the launch after this one too
    assert any("closed while loading my-model.gguf" in text for text in window.notices.texts())
    assert not marker.exists()


def test_a_recurrent_model_chats_without_speculation_and_says_why(dirs, make_window, quick_settings):
    path = write_tiny_mamba(dirs / "tiny-mamba.gguf")
    window = make_window(replace(quick_settings, model=str(path), method="lookup", n_ctx=256))
    assert window.model_info["method"] == "none"
    assert any("recurrent or hybrid" in text for text in window.notices.texts())


@pytest.mark.slow
def test_pasted_text_with_a_lone_surrogate_is_answered_and_saved(make_window, wait_response, quick_settings):
    window = make_window(quick_settings)
    assert window.session.send("Broken paste: \ud800 end. Pairs stay: \U0001f600")  # as --send or a paste passes it
    reply = wait_response(window)
    assert reply.status == "done" and reply.content
    saved = window.store.messages(window.session.conversation_id)
    assert saved[0].content == "Broken paste: \ufffd end. Pairs stay: \U0001f600"


@pytest.mark.slow
def test_a_failed_continue_leaves_the_answer_as_it_was(make_window, wait_response, quick_settings, dirs, qtbot):
    window = make_window(replace(quick_settings, max_tokens=6))
    window.session.send("Count: 1, 2, 3, 4,")
    reply = wait_response(window)
    assert reply.stats["finish_reason"] == "length"
    before = (reply.status, reply.content, reply.stats)
    with qtbot.waitSignal(window.modelFailed, timeout=30_000):
        window.apply_settings(replace(window.settings, model=str(dirs / "gone.gguf")))
    assert window.session.continue_answer()
    qtbot.waitUntil(lambda: not window.session.busy, timeout=30_000)
    assert (reply.status, reply.content, reply.stats) == before  # still an answer, still continuable
    assert "No model is loaded" in reply.notice
    assert window.session.prompt_history(window.session.model.items)[-1]["content"] == reply.content


def test_a_lone_surrogate_in_a_chat_system_prompt_is_answered(make_window, wait_response, quick_settings):
    window = make_window(quick_settings)
    window.session.set_conversation_settings({"system_prompt": "Be brief \ud83d."})  # half an emoji, pasted
    assert window.session.send("Hello")
    assert wait_response(window).status == "done"
