"""Text files in a message, through the real window and the real embedded model: dropped or chosen files
become chips, go into the message for the model (and prompt lookup) to read, show as chips once sent, and
binaries or files too large for the context are refused with a message."""

from dataclasses import replace

import pytest
from PySide6.QtWidgets import QFileDialog, QPlainTextEdit

from app.chat.attachments import Attachment, AttachmentTray, compose, split_attachments

from support.window import drop

POEM = (
    "The quick brown fox jumps over the lazy dog.\n"
    "The lazy dog sleeps in the sun.\n"
    "The sun sets behind the hill, and the fox runs home.\n"
)


def test_compose_and_split_round_trip_even_with_fences_inside():
    tricky = Attachment("README.md", "Use it like this:\n\n```bash\nrun --fast\n```\n\nFile: not a header\n")
    plain = Attachment("data.csv", "a,b\n1,2\n")
    message = compose("  Compare these.  ", [tricky, plain])
    assert message.startswith("Compare these.\n\nFile: README.md\n````md\n")  # a fence longer than the file's
    text, files = split_attachments(message)
    assert text == "Compare these." and [f.name for f in files] == ["README.md", "data.csv"]
    assert files[0].text == tricky.text.removesuffix("\n") and files[1].text == "a,b\n1,2"
    assert split_attachments(compose("", [plain]))[0] == ""
    for ordinary in ("Just words.", "File: x.txt\nno fence here", "```\ncode\n```"):
        assert split_attachments(ordinary) == (ordinary, [])


@pytest.mark.slow
def test_a_dropped_file_is_sent_as_a_chip_and_prompt_lookup_copies_from_it(
    make_window, qtbot, wait_response, quick_settings, dirs
):
    poem = dirs / "poem.txt"
    poem.write_text(POEM, encoding="utf-8")
    # The embedded SmolLM2 follows the instruction (the Gemma base model would not); greedy, lookup on.
    window = make_window(replace(quick_settings, max_tokens=80, method="lookup", speculation=True))
    assert drop(window.input.viewport(), poem)
    qtbot.waitUntil(lambda: len(window.tray.attachments) == 1, timeout=30_000)  # sized in the model's tokens
    chip = window.tray.chips[0]
    assert "poem.txt" in chip.view_button.text() and chip.remove_button is not None
    assert window.input.toPlainText() == ""  # the file is attached, not pasted as a path

    window.input.setPlainText("Repeat this file exactly:")
    window.send_message()
    assert window.tray.attachments == [] and window.input.toPlainText() == ""
    sent = window.session.request.messages[-1]["content"]
    assert sent.startswith("Repeat this file exactly:\n\nFile: poem.txt\n```txt\n") and POEM.strip() in sent
    reply = wait_response(window)
    assert reply.status == "done"
    assert POEM.strip() in reply.content, reply.content  # the answer copies the file...
    assert reply.stats["method"] == "lookup" and reply.stats["accepted"] > 0  # ...from accepted lookup drafts

    shown = window.view.widget_for(0)  # the sent message: its words and a chip, not the file's text
    assert shown.text.toPlainText() == "Repeat this file exactly:"
    assert [c.attachment.name for c in shown.text.files.chips] == ["poem.txt"]
    assert shown.text.files.chips[0].remove_button is None
    shown.text.files.chips[0].view_button.click()  # view it
    viewer = shown.text.files.chips[0].dialog
    assert viewer.isVisible() and POEM.strip() in viewer.findChild(QPlainTextEdit).toPlainText()
    viewer.close()


@pytest.mark.slow
def test_files_dropped_on_the_window_or_chosen_with_the_paperclip_are_attached(
    make_window, qtbot, quick_settings, dirs, monkeypatch
):
    notes, log = dirs / "notes.md", dirs / "run.log"
    notes.write_text("# Notes\n\n- one\n- two\n", encoding="utf-8")
    log.write_text("12:00 start\n12:01 done\n", encoding="utf-8")
    window = make_window(quick_settings)
    assert drop(window, notes)  # anywhere on the window, not only on the message box
    qtbot.waitUntil(lambda: len(window.tray.attachments) == 1, timeout=30_000)
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(log)], ""))  # modal: see README
    window.attach_button.click()
    qtbot.waitUntil(lambda: len(window.tray.attachments) == 2, timeout=30_000)
    assert [a.name for a in window.tray.attachments] == ["notes.md", "run.log"]
    window.tray.chips[0].remove_button.click()  # ✕ before sending
    assert [a.name for a in window.tray.attachments] == ["run.log"]

    window.input.setPlainText("What happened?")
    window.send_message()
    qtbot.waitUntil(lambda: not window.session.busy, timeout=120_000)
    window.chat.start_edit(window.session.model.items[0])  # editing the sent message brings its chip back
    assert window.input.toPlainText() == "What happened?"
    assert [a.name for a in window.tray.attachments] == ["run.log"]


def test_binary_undecodable_and_oversize_files_are_refused_with_a_message(make_window, qtbot, quick_settings, dirs):
    picture, blob, latin, big = dirs / "photo.png", dirs / "data.dat", dirs / "old.txt", dirs / "huge.log"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    blob.write_bytes(b"header\x00\x01\x02 binary")
    latin.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    big.write_text(
        "\n".join(f"line {i}: the service answered request {i} in {i % 97} ms" for i in range(400)), encoding="utf-8"
    )
    window = make_window(replace(quick_settings, n_ctx=1024, max_tokens=24))
    window.tray.add_files([str(picture), str(blob), str(latin), str(dirs / "missing.txt")])
    qtbot.waitUntil(lambda: window.tray.pending == 0, timeout=30_000)  # files are read off the GUI thread
    texts = window.notices.texts()
    assert any("photo.png is a .png file, not text" in t for t in texts), texts
    assert any("data.dat is a binary file" in t for t in texts), texts
    assert any("old.txt is not UTF-8 text" in t for t in texts), texts
    assert any("missing.txt could not be read" in t for t in texts), texts

    window.tray.add_files([str(big)])  # about 8,000 tokens, for a 1,024-token context
    qtbot.waitUntil(lambda: any("huge.log is too large" in t for t in window.notices.texts()), timeout=30_000)
    refusal = next(t for t in window.notices.texts() if "huge.log is too large" in t)
    assert "1,000 tokens" in refusal and "tokens" in refusal.split("it is ")[1]
    assert window.tray.attachments == [] and not window.tray.isVisible()  # nothing attached, nothing lost


def test_with_no_model_loaded_a_byte_bound_refuses_what_cannot_fit(qtbot, dirs):
    big, small = dirs / "big.txt", dirs / "small.txt"
    big.write_text("x" * 9000, encoding="utf-8")
    small.write_text("fits\n", encoding="utf-8")
    tray = AttachmentTray(counter=None, budget=lambda: 1000)
    qtbot.addWidget(tray)
    refused = []
    tray.refused.connect(refused.append)
    tray.add_files([str(big), str(small)])
    qtbot.waitUntil(lambda: tray.pending == 0, timeout=30_000)  # files are read off the GUI thread
    assert len(refused) == 1 and "big.txt is too large" in refused[0] and "9.0 KB" in refused[0]
    assert [a.name for a in tray.attachments] == ["small.txt"]


@pytest.mark.slow
def test_send_waits_for_a_file_still_being_checked(make_window, qtbot, wait_response, quick_settings, dirs):
    notes = dirs / "notes.md"
    notes.write_text("# Notes\n\n- one\n- two\n", encoding="utf-8")
    window = make_window(quick_settings)
    qtbot.waitUntil(lambda: window.counter.available, timeout=30_000)  # files are counted in the model's tokens
    window.tray.add_files([str(notes)])  # on the meter's thread: the answer comes back as an event
    window.input.setPlainText("Summarise the notes.")
    window.send_message()  # before the count is back: nothing is sent without the file
    assert window.session.model.items == [] and window.input.toPlainText() == "Summarise the notes."
    assert "still being checked" in window.statusBar().currentMessage()
    qtbot.waitUntil(lambda: len(window.tray.attachments) == 1, timeout=30_000)
    window.send_message()
    wait_response(window)
    assert "File: notes.md" in window.session.model.items[0].content
