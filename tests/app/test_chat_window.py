"""The chat window with the real embedded model: streaming, live stats, stop, regenerate, edit,
saving, restoring, and the faults a user can run into."""

import threading
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from app.conversations.store import ConversationStore, Message, default_path
from engine.decoding.answer import Delta

from support.this_build import BACKEND, MEMORY_KIND
from support.window import PASSAGE, STALL_LIMIT_S


def saved_messages(conversation_id):
    store = ConversationStore(default_path())
    try:
        return store.messages(conversation_id)
    finally:
        store.close()


def waits_for_the_window(real, on_screen: threading.Event, shown_first: list[bool]):
    """decoder.generate that, after its first text, writes nothing more until the window shows it (on_screen; the
    engine's loop goes on turning, so its batch is handed over as it would be), for a minute at most: streaming,
    proved by order. An answer shown only at its end would leave shown_first == [False]."""

    def generate(*args, **kwargs):
        for delta in real(*args, **kwargs):
            yield delta
            if not shown_first and any(text for text, _ in delta.segments):
                for _ in range(6_000):
                    if on_screen.wait(0.01):
                        break
                    yield Delta(tokens=[], segments=[])
                shown_first.append(on_screen.is_set())

    return generate


def test_send_streams_text_with_live_stats_and_saves_them(
    make_window, qtbot, wait_response, quick_settings, monkeypatch
):
    window = make_window(replace(quick_settings, max_tokens=40, color_drafts=True))
    live = []  # (chars shown, stats line) at each batched update the window shows while streaming
    on_screen = threading.Event()

    def seen(*_):
        w = window.view.widget_for(window.session.model.rowCount() - 1)
        if w is not None and window.session.busy and w.text.toPlainText():
            on_screen.set()
        if w is not None and window.session.busy and w.stats.isVisible():
            live.append((len(w.text.toPlainText()), w.stats.text()))

    window.session.model.dataChanged.connect(seen)
    shown_first: list[bool] = []
    decoder = window.engine.worker.decoder
    monkeypatch.setattr(decoder, "generate", waits_for_the_window(decoder.generate, on_screen, shown_first))

    window.input.setPlainText(PASSAGE)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    assert window.input.toPlainText() == ""  # Enter sent it
    reply = wait_response(window)

    assert reply.role == "assistant" and reply.status == "done"
    assert "lighthouse" in reply.content  # greedy copying of the passage
    assert shown_first == [True], "the first text should be on screen while the answer is still being written"
    assert len(live) >= 2 and live[0][0] < live[-1][0], "text should appear in several batches as it streams"
    assert "tok/s" in live[-1][1] and "accepted" in live[-1][1]
    stats = reply.stats
    assert stats["generated"] >= 2 and stats["tokens_per_s"] > 0 and stats["ttft_s"] > 0
    assert stats["method"] == "lookup" and stats["drafted"] > 0 and stats["accepted"] > 0
    assert 0 < stats["acceptance_rate"] <= 1 and stats["mean_acceptance_length"] > 1
    assert stats["memory_kind"] == MEMORY_KIND and stats["memory_bytes"] > 50e6 and stats["backend"] == BACKEND
    assert reply.draft_spans  # accepted-draft characters are known, for the colour toggle

    shown = window.view.widget_for(window.session.model.rowCount() - 1)
    assert "lighthouse" in shown.text.toPlainText()
    line = shown.stats.text()
    for part in (
        f"{stats['tokens_per_s']:.1f} tok/s",
        f"TTFT {stats['ttft_s']:.2f} s",
        f"({stats['accepted']}/{stats['drafted']})",
        "prompt lookup",
        f"{MEMORY_KIND} ",
        BACKEND,
    ):
        assert part in line, (part, line)

    saved = saved_messages(window.session.conversation_id)
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[1].content == reply.content and saved[1].stats["drafted"] == stats["drafted"]
    assert window.panel.model.rows[0].title.startswith("Passage: The lighthouse")


@pytest.mark.slow
def test_stop_mid_stream_keeps_the_text(make_window, qtbot, wait_response, quick_settings):
    window = make_window(replace(quick_settings, max_tokens=400))
    window.session.send(PASSAGE)
    qtbot.waitUntil(lambda: len(window.session.model.items[-1].content) > 20, timeout=120_000)
    assert window.send_button.text() == "Stop"
    window.input.setPlainText("my next question")
    qtbot.keyClick(window.input, Qt.Key.Key_Return)  # Enter while writing neither stops nor sends
    assert window.session.busy and window.input.toPlainText() == "my next question"
    qtbot.mouseClick(window.send_button, Qt.MouseButton.LeftButton)
    reply = wait_response(window, timeout=10_000)
    assert reply.status == "stopped" and reply.stats["finish_reason"] == "cancelled"
    assert len(reply.content) > 20 and reply.stats["generated"] < 400
    assert window.send_button.text() == "Send"
    assert "stopped by you" in window.view.widget_for(1).stats.text()
    assert window.windowTitle() == window.panel.model.rows[0].title + " — SpecChat"
    saved = saved_messages(window.session.conversation_id)[-1]
    assert saved.status == "stopped" and saved.content == reply.content


@pytest.mark.slow
def test_regenerate_and_edit_last_message(make_window, qtbot, wait_response, quick_settings):
    window = make_window(replace(quick_settings, max_tokens=12))
    window.session.send("Name three colours.")
    first = wait_response(window).content
    widget = window.view.widget_for(1)
    assert widget.regenerate_button.isVisible() and window.view.widget_for(0).edit_button.isVisible()
    qtbot.mouseClick(widget.regenerate_button, Qt.MouseButton.LeftButton)
    again = wait_response(window)
    assert window.session.model.rowCount() == 2 and again.content == first  # greedy: same answer again

    qtbot.mouseClick(window.view.widget_for(0).edit_button, Qt.MouseButton.LeftButton)
    assert window.input.toPlainText() == "Name three colours." and window.edit_label.isVisible()
    window.input.setPlainText("Name three animals.")
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    wait_response(window)
    items = window.session.model.items
    assert [m.role for m in items] == ["user", "assistant"] and items[0].content == "Name three animals."
    saved = saved_messages(window.session.conversation_id)
    assert [(m.role, m.content) for m in saved] == [(m.role, m.content) for m in items]


@pytest.mark.slow
def test_conversations_are_restored_after_a_restart(make_window, qtbot, wait_response, quick_settings):
    window = make_window(quick_settings)
    window.session.send("Hello there")
    reply = wait_response(window)
    window.new_chat()
    window.session.send("Second chat")
    wait_response(window)
    window.close()

    again = make_window(quick_settings)
    assert [c.title for c in again.panel.model.rows] == ["Second chat", "Hello there"]
    assert again.panel.current_id() == again.session.conversation_id  # the newest is open
    again.panel.list.setCurrentIndex(again.panel.model.index(1))
    items = again.session.model.items
    assert [(m.role, m.content) for m in items] == [("user", "Hello there"), ("assistant", reply.content)]
    assert items[1].stats["tokens_per_s"] == reply.stats["tokens_per_s"]
    assert f"{reply.stats['tokens_per_s']:.1f} tok/s" in again.view.widget_for(1).stats.text()


@pytest.mark.slow
def test_ui_thread_never_stalls_during_load_and_generation(
    make_window, qtbot, wait_response, quick_settings, stall_probe
):
    stall_probe.start()
    window = make_window(replace(quick_settings, max_tokens=48, color_drafts=True))  # loading counts too
    window.session.send(PASSAGE)
    wait_response(window)
    worst = stall_probe.stop()
    gaps = stall_probe.gaps
    print(
        f"\nUI stall probe: {len(gaps)} ticks, worst gap {worst * 1000:.1f} ms, "
        f"99th percentile {sorted(gaps)[int(len(gaps) * 0.99)] * 1000:.1f} ms"
    )
    assert worst < STALL_LIMIT_S, f"the GUI thread worked {worst * 1000:.0f} ms in one go"


@pytest.mark.slow
def test_engine_failure_mid_stream_is_shown_and_text_kept(
    make_window, qtbot, wait_response, quick_settings, monkeypatch
):
    window = make_window(replace(quick_settings, max_tokens=40))
    decoder = window.engine.worker.decoder
    real = decoder.generate

    def breaks_after_some_tokens(*args, **kwargs):  # a fault the real engine cannot be made to have
        for i, delta in enumerate(real(*args, **kwargs)):
            yield delta
            if i == 3:
                raise RuntimeError("simulated GPU fault")

    monkeypatch.setattr(decoder, "generate", breaks_after_some_tokens)
    window.session.send(PASSAGE)
    reply = wait_response(window)
    assert reply.status == "error" and "simulated GPU fault" in reply.notice
    assert reply.content  # what arrived before the fault is kept
    assert any("simulated GPU fault" in t for t in window.notices.texts())
    saved = saved_messages(window.session.conversation_id)[-1]
    assert saved.status == "error" and saved.content == reply.content
    monkeypatch.setattr(decoder, "generate", real)
    window.session.send("Still alive?")
    assert wait_response(window).status == "done"


@pytest.mark.slow
def test_missing_or_corrupt_model_file_is_reported_and_recoverable(
    make_window, qtbot, wait_response, quick_settings, dirs
):
    window = make_window(replace(quick_settings, model=str(dirs / "nowhere.gguf")), wait_loaded=False)
    qtbot.waitUntil(lambda: window.model_label.text() == "No model loaded", timeout=30_000)
    assert any("could not be loaded" in t for t in window.notices.texts())
    window.session.send("hello")
    reply = wait_response(window)
    assert reply.status == "error" and "No model is loaded" in reply.notice

    broken = dirs / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with qtbot.waitSignal(window.modelFailed, timeout=30_000) as failed:
        window.apply_settings(replace(window.settings, model=str(broken)))
    assert "broken.gguf" in failed.args[0]
    with qtbot.waitSignal(window.modelLoaded, timeout=120_000):
        window.apply_settings(replace(window.settings, model="embedded"))
    assert not any("could not be loaded" in t for t in window.notices.texts())
    window.session.send("hello again")
    assert wait_response(window).status == "done"


@pytest.mark.slow
def test_unusable_draft_turns_speculation_off_but_keeps_the_target(
    make_window, qtbot, wait_response, quick_settings, dirs
):
    bad = dirs / "draft.gguf"
    bad.write_bytes(b"not a gguf at all")
    window = make_window(replace(quick_settings, method="draft", draft=str(bad)))
    assert window.model_info["method"] == "none"
    assert any("Speculation is off" in t for t in window.notices.texts())
    window.session.send("hello")
    reply = wait_response(window)
    assert reply.status == "done" and reply.stats["method"] == "none"


@pytest.mark.slow
def test_speculation_changes_apply_without_reload(make_window, qtbot, wait_response, quick_settings):
    window = make_window(quick_settings)
    reloads = []
    window.modelLoaded.connect(reloads.append)
    with qtbot.waitSignal(window.speculationChanged, timeout=10_000) as applied:
        window.apply_settings(replace(window.settings, speculation=False))
    assert applied.args[0]["method"] == "none"
    qtbot.waitUntil(lambda: window.spec_label.text() == "Speculation: off", timeout=5_000)
    assert reloads == []
    window.session.send("Hi")
    assert wait_response(window).stats["method"] == "none"
    with qtbot.waitSignal(window.modelLoaded, timeout=120_000) as loaded:
        window.apply_settings(replace(window.settings, n_ctx=512))
    assert loaded.args[0]["n_ctx"] == 512


@pytest.mark.slow
def test_context_overflow_trims_old_turns_or_refuses(make_window, qtbot, wait_response, quick_settings):
    store = ConversationStore(default_path())
    cid = store.create_conversation("Long chat")
    for i in range(12):
        store.add_message(cid, Message(None, "user", f"Tell me fact number {i} about the sea. " * 3))
        store.add_message(cid, Message(None, "assistant", f"Fact {i}: the sea is large and deep. " * 3))
    store.close()
    # Drafts of up to 8: a context of its own times its verify sizes first (9 sizes, not 49); this is about trimming.
    window = make_window(replace(quick_settings, n_ctx=256, max_tokens=16, max_draft=8))
    assert window.session.conversation_id == cid
    window.session.send("And one more?")
    reply = wait_response(window)
    assert reply.status == "done" and reply.stats["trimmed_messages"] >= 2
    assert any("oldest messages" in t for t in window.notices.texts())
    assert len(saved_messages(cid)) == 26  # trimmed from the prompt, never from the store

    window.session.send("word " * 400)
    reply = wait_response(window)
    assert reply.status == "error" and "Shorten the message" in reply.notice


@pytest.mark.slow
def test_closing_while_generating_saves_the_partial_response(make_window, qtbot, quick_settings, monkeypatch):
    """Closing does not wait for the answer: the test holds the engine between two tokens, and the window closes
    (and saves what it has) while it is held there."""
    window = make_window(replace(quick_settings, max_tokens=400))
    decoder = window.engine.worker.decoder
    real, hold, held = decoder.generate, threading.Event(), threading.Event()
    hold.set()  # tokens flow until the test holds them

    def holdable(*args, **kwargs):
        for delta in real(*args, **kwargs):
            yield delta
            if not hold.is_set():
                held.set()
                hold.wait(120)

    monkeypatch.setattr(decoder, "generate", holdable)
    window.session.send(PASSAGE)
    qtbot.waitUntil(lambda: len(window.session.model.items[-1].content) > 10, timeout=120_000)
    cid = window.session.conversation_id
    hold.clear()
    qtbot.waitUntil(held.is_set, timeout=60_000)
    window.close()
    assert not hold.is_set() and not window.engine.thread.isFinished()  # closed while the engine was held
    saved = saved_messages(cid)[-1]
    assert saved.status == "stopped" and len(saved.content) > 10  # saved by the close itself
    hold.set()
    qtbot.waitUntil(window.engine.thread.isFinished, timeout=60_000)  # asked to stop; closing does not wait for it
    assert saved_messages(cid)[-1].status == "stopped"


@pytest.mark.slow
def test_draft_model_method_with_the_embedded_model_as_its_own_draft(make_window, wait_response, quick_settings):
    window = make_window(replace(quick_settings, method="draft", draft=quick_settings.model, max_tokens=40))
    assert window.model_info["method"] == "draft" and window.spec_label.text().startswith("Speculation: draft model")
    window.session.send(PASSAGE)
    stats = wait_response(window).stats
    assert stats["method"] == "draft"
    if stats["drafted"]:  # the cost model may keep a costly draft paused on a slow machine
        assert stats["acceptance_rate"] > 0.9  # a model drafting for itself is (almost) always right
    assert "draft model" in window.view.widget_for(1).stats.text()
