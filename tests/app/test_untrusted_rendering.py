"""Text from outside SpecChat (an answer, a saved or imported chat, an error, a model's name) never reads a local
file, and its links open only http(s) and mailto, after the user has seen the address (app/safe_text.py).

Each case uses a FIFO trap (support/fifo_trap.py): on the code before safe_text, Qt opened it on the GUI thread."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QEvent, QObject, QPoint, Qt, QTimer, QUrl, Slot
from PySide6.QtGui import QDesktopServices, QHelpEvent, QTextCursor
from PySide6.QtWidgets import QApplication, QMessageBox

from support.fifo_trap import FifoTrap
from support.window import streams


class UrlCatcher(QObject):
    """Stands in for the system's browser: QDesktopServices hands it the URLs it would open."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.urls.append(url.toString())


def answer_modal(clicks: str, seen: list[str], delay_ms: int = 300) -> None:
    """Once a modal message box is up, keep its text in seen and press the button named clicks."""

    def act() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(50, act)
            return
        seen.append(box.text())
        for button in box.buttons():
            if button.text().replace("&", "") == clicks:
                button.click()
                return
        box.reject()

    QTimer.singleShot(delay_ms, act)


def fragments(doc):
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            yield it.fragment()
            it += 1
        block = block.next()


def word_position(text_widget, at: int | str) -> QPoint:
    """Where the character at `at` (or the first character of the text `at`) is drawn."""
    doc = text_widget.document()
    cursor = QTextCursor(doc)
    cursor.setPosition((doc.toPlainText().index(at) if isinstance(at, str) else at) + 1)
    return text_widget.cursorRect(cursor).center()


def click_link(qtbot, text_widget, href: str) -> None:
    """Click the anchor whose href is href in a rendered message, as a person would."""
    for fragment in fragments(text_widget.document()):
        if fragment.charFormat().anchorHref() == href:
            qtbot.mouseClick(
                text_widget.viewport(), Qt.MouseButton.LeftButton, pos=word_position(text_widget, fragment.position())
            )
            return
    raise AssertionError(f"no link to {href} in {text_widget.document().toPlainText()!r}")


def test_an_answer_naming_local_images_reads_none_of_them(make_window, qtbot, wait_response, quick_settings, tmp_path):
    with FifoTrap(tmp_path / "image.fifo") as trap:
        text = (
            f'Here: ![a picture]({trap.url})\n\nand <img src="{trap.url}"> inline, '
            f"and a reference ![b][pic].\n\n[pic]: {trap.url}\n\nThe end."
        )
        window = make_window(quick_settings)
        window.engine.worker.decoder.generate = streams(text)
        window.session.send("Show me a picture.")
        reply = wait_response(window)
        qtbot.wait(300)  # painting and layout: where Qt would load the image
        assert reply.content == text
        assert "The end." in window.view.widget_for(1).text.toPlainText()
        assert trap.opened == 0, "the answer's image was read from disk"


def test_a_saved_conversation_with_a_fifo_image_opens_at_launch(make_window, qtbot, quick_settings, tmp_path):
    """The window reopens the last conversation at launch: a FIFO image in it froze every later launch."""
    from app.conversations.store import ConversationStore, Message, default_path

    with FifoTrap(tmp_path / "launch.fifo") as trap:
        store = ConversationStore(default_path())
        cid = store.create_conversation("Imported")
        store.add_message(cid, Message(None, "user", f"look ![x]({trap.url})"))
        store.add_message(cid, Message(None, "assistant", f"![y]({trap.url}) <img src='{trap.url}'>", stats={}))
        store.close()
        window = make_window(quick_settings)
        qtbot.wait(300)
        assert window.session.conversation_id == cid
        assert trap.opened == 0


@pytest.mark.slow
def test_a_file_link_is_text_and_a_web_link_asks_first(make_window, qtbot, wait_response, quick_settings):
    catcher = UrlCatcher()
    for scheme in ("http", "https", "file", "smb", "javascript"):
        QDesktopServices.setUrlHandler(scheme, catcher, "open")
    try:
        text = (
            "Read [the file](file:///etc/hostname), [a share](smb://host/share), [script](javascript:alert(1)) "
            "or [the docs](https://example.org/docs?q=1)."
        )
        window = make_window(quick_settings)
        window.engine.worker.decoder.generate = streams(text)
        window.session.send("Links?")
        wait_response(window)
        body = window.view.widget_for(1).text.answer.chunks[0]
        hrefs = {f.charFormat().anchorHref() for f in fragments(body.document())} - {""}
        assert hrefs == {"https://example.org/docs?q=1"}  # the others show as text: nothing to click
        assert "the file" in body.toPlainText() and "a share" in body.toPlainText()
        before = body.toPlainText()
        qtbot.mouseClick(body.viewport(), Qt.MouseButton.LeftButton, pos=word_position(body, "the file"))
        qtbot.wait(200)
        assert body.toPlainText() == before and QApplication.activeModalWidget() is None

        # A notice's link (notices are SpecChat's words around outside text) is refused when clicked.
        seen: list[str] = []
        answer_modal("OK", seen)
        window.notices.show_notice("See [the file](file:///etc/hostname).", "info").label.linkActivated.emit(
            "file:///etc/hostname"
        )
        assert seen and "not opened" in seen[0] and "file:///etc/hostname" in seen[0]
        assert catcher.urls == []

        seen = []
        answer_modal("Cancel", seen)
        click_link(qtbot, body, "https://example.org/docs?q=1")
        qtbot.waitUntil(lambda: bool(seen), timeout=5000)
        assert "https://example.org/docs?q=1" in seen[0] and catcher.urls == []  # the whole address, then no
        seen = []
        answer_modal("Open", seen)
        click_link(qtbot, body, "https://example.org/docs?q=1")
        qtbot.waitUntil(lambda: bool(catcher.urls), timeout=5000)
        assert catcher.urls == ["https://example.org/docs?q=1"]
    finally:
        for scheme in ("http", "https", "file", "smb", "javascript"):
            QDesktopServices.unsetUrlHandler(scheme)


def test_notices_message_boxes_and_tooltips_read_no_file(make_window, qtbot, quick_settings, tmp_path):
    window = make_window(quick_settings)
    with FifoTrap(tmp_path / "text.fifo") as trap:
        hostile = f'<img src="{trap.url}"> ![x]({trap.url}) failed'
        window.notices.show_notice(f"The server said: {hostile}", "error")
        qtbot.wait(200)
        assert any("failed" in t for t in window.notices.texts())

        seen: list[str] = []
        answer_modal("OK", seen, delay_ms=200)
        QMessageBox.warning(window, "Models", hostile)  # as the app's own message boxes show errors
        assert seen and trap.url in seen[0]  # shown as text

        window.model_label.setToolTip(hostile)
        label = window.model_label
        QApplication.sendEvent(label, QHelpEvent(QEvent.Type.ToolTip, QPoint(2, 2), label.mapToGlobal(QPoint(2, 2))))
        qtbot.wait(300)
        assert trap.opened == 0


@pytest.mark.slow
def test_a_model_whose_name_is_html_loads_and_shows_it_as_text(
    make_window, qtbot, quick_settings, tmp_path, monkeypatch
):
    """A GGUF's general.name is the file's word: the window's model line once rendered it as rich text."""
    from dataclasses import replace

    from engine.modelfiles.embedded import embedded_model_path

    data = bytearray(embedded_model_path().read_bytes())
    name = b"Smollm2 135M 8k Lc100K Mix1 Ep2"
    hostile = b'<img src="n.fifo"' + b" " * (len(name) - 18) + b">"
    assert len(hostile) == len(name) and data.count(name) == 1
    data[data.find(name) : data.find(name) + len(name)] = hostile
    model = tmp_path / "renamed.gguf"
    model.write_bytes(bytes(data))
    monkeypatch.chdir(tmp_path)  # Qt resolves a relative image against the working folder
    with FifoTrap(tmp_path / "n.fifo") as trap:
        window = make_window(replace(quick_settings, model=str(model)))
        qtbot.wait(300)
        assert window.model_label.text().startswith("<img src=")
        assert trap.opened == 0
