"""Rough edges a new user met, each through the window as a person meets it (issue 52): a new chat's context count,
the status bar at 800×600, the title after a rename and after an import, the export's file name and folder, the
theme, and a shortcut that copies the last answer."""

from __future__ import annotations

import logging
import re
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication, QKeySequence, QPalette
from PySide6.QtWidgets import QApplication, QFileDialog, QLabel, QLineEdit

from app.chat.engine_picker import REMOTE
from app.settings.values import load_settings
from engine.chat_format import ChatFormatter
from engine.decoding.runtime import LoadSettings, Model

from support.hostile_templates import CHATML, hostile_gguf
from support.window import menu_actions

# As Gemma's, Qwen's and Llama's own templates begin: they read messages[0], which an empty chat does not have.
READS_FIRST = "{% if messages[0]['role'] == 'system' %}{% set lead = messages[0]['content'] %}{% endif %}" + CHATML
QUESTION = "Explain `git rebase --onto` to me, with an example of how it moves commits between branches please"


def action(window, label: str):
    return dict(menu_actions(window))[label]


def wait_count(qtbot, window, text: str) -> None:
    qtbot.waitUntil(lambda: window.meter.count.text() == text, timeout=30_000)


@pytest.fixture
def system_theme():
    """The application's colours as a fresh start has them, before and after (the palette is the application's)."""
    from app.theme import apply_theme

    apply_theme("system")
    QApplication.setPalette(QPalette())
    yield
    apply_theme("system")
    QApplication.setPalette(QPalette())


# --- 1. a new chat's context count ---------------------------------------------------------------
@pytest.mark.slow
def test_a_new_chat_shows_its_own_count_at_once_never_the_last_chats(
    make_window, qtbot, wait_response, quick_settings, caplog
):
    caplog.set_level(logging.WARNING)
    window = make_window(quick_settings)
    window.input.setPlainText("Name a colour.")
    window.send_message()
    wait_response(window)
    qtbot.waitUntil(lambda: window.meter.measure is not None and window.meter.measure.tokens > 0, timeout=30_000)
    before = window.meter.count.text()
    action(window, "File → New chat").trigger()
    assert window.meter.count.text() != before  # not the last chat's figure while the new one is counted
    wait_count(qtbot, window, "0 / 1,024 tokens")  # nothing is sent for an empty chat
    assert window.meter.measure.tokens == 0
    assert not [r for r in caplog.records if "token count failed" in r.getMessage()]


@pytest.mark.slow
def test_an_empty_chat_on_a_template_that_reads_the_first_message_counts_0_then_its_system_prompt(
    make_window, qtbot, dirs, caplog, monkeypatch
):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(dirs / "cache"))
    caplog.set_level(logging.WARNING)
    path = hostile_gguf(dirs / "reads-first.gguf", READS_FIRST, complete=True)
    from app.settings.values import AppSettings

    window = make_window(AppSettings(model=str(path), temperature=0.0, max_tokens=4, n_ctx=256, threads=1))
    qtbot.waitUntil(lambda: window.counter.available, timeout=30_000)
    wait_count(qtbot, window, "0 / 256 tokens")
    dialog = window.chat_settings_button.open_dialog()
    dialog.system_prompt.setPlainText("w1 w2 w3")
    dialog.accept()
    model = Model(str(path), LoadSettings(n_gpu_layers=0), vocab_only=True)
    model.n_ctx = 256
    try:
        expected = len(ChatFormatter(model).render([{"role": "system", "content": "w1 w2 w3"}])[1])
    finally:
        model.close()
    assert expected > 0
    wait_count(qtbot, window, f"{expected} / 256 tokens")
    assert not [r for r in caplog.records if "token count failed" in r.getMessage()]


# --- 2. the status bar at 800×600 ----------------------------------------------------------------
def start_server(window, qtbot) -> None:
    window.tools.open_server()
    panel = window.tools.server
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        panel.port.setValue(sock.getsockname()[1])
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.server_label.isVisible(), timeout=60_000)
    panel.hide()


def assert_segments_fit(window) -> list:
    bar = window.statusBar()
    segments = [w for w in bar.findChildren(QLabel) + [window.progress] if w.isVisible() and w.parent() is bar]
    for i, a in enumerate(segments):
        assert bar.rect().contains(a.geometry()), (a, a.geometry(), bar.rect())
        for b in segments[i + 1 :]:
            assert not a.geometry().intersects(b.geometry()), (
                QLabel.text(a) if isinstance(a, QLabel) else a,
                QLabel.text(b) if isinstance(b, QLabel) else b,
            )
        if isinstance(a, QLabel):
            shown = QLabel.text(a)  # what is drawn (a label that elides keeps its whole text in text())
            assert a.fontMetrics().horizontalAdvance(shown) <= a.contentsRect().width(), shown
            if shown != a.text():
                assert "…" in shown and a.text() in a.toolTip()  # cut, and whole in its tooltip
    return segments


@pytest.mark.slow
def test_the_status_bar_segments_never_overlap_at_800_by_600(make_window, qtbot, quick_settings):
    window = make_window(quick_settings)
    window.resize(800, 600)
    start_server(window, qtbot)
    dialog = window.chat_settings_button.open_dialog()  # this chat on a server elsewhere
    dialog.engine.setCurrentIndex(dialog.engine.findData(REMOTE))
    dialog.engine_url.setText("http://gpu-server.example.org:8000")
    dialog.accept()
    qtbot.waitUntil(lambda: window.engine_label.isVisible(), timeout=10_000)
    qtbot.wait(200)
    assert (window.width(), window.height()) == (800, 600)
    segments = assert_segments_fit(window)
    assert {window.model_label, window.spec_label, window.server_label, window.engine_label} <= set(segments)
    assert window.model_label.text().startswith("SmolLM2")

    # A message in the model's place (as the engine's "timing its steps" one): elided in its segment as well.
    window.statusBar().showMessage(
        "Timing this machine's steps for speculation (a few seconds; the window stays usable)…"
    )
    qtbot.wait(200)
    segments = assert_segments_fit(window)
    assert any(isinstance(s, QLabel) and s.text().startswith("Timing this machine") for s in segments)
    assert window.statusBar().currentMessage().startswith("Timing this machine")
    window.statusBar().clearMessage()
    qtbot.wait(100)
    assert window.model_label in assert_segments_fit(window) and window.statusBar().currentMessage() == ""

    window.resize(1500, 700)  # room for all: nothing is cut
    qtbot.waitUntil(lambda: window.width() == 1500, timeout=5000)
    qtbot.wait(100)
    for label in assert_segments_fit(window):
        if isinstance(label, QLabel):
            assert QLabel.text(label) == label.text()


# --- 3. the title follows a rename; an import is marked --------------------------------------------
@pytest.mark.slow
def test_the_window_title_follows_a_rename_in_the_sidebar(make_window, qtbot, wait_response, quick_settings):
    window = make_window(quick_settings)
    window.input.setPlainText("Name a colour.")
    window.send_message()
    wait_response(window)
    assert window.windowTitle() == "Name a colour. — SpecChat"
    index = window.panel.list.currentIndex()
    window.panel.list.edit(index)  # as a double-click or F2 opens it
    editor = window.panel.list.viewport().findChild(QLineEdit) or window.panel.list.findChild(QLineEdit)
    editor.selectAll()
    qtbot.keyClicks(editor, "Colours")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.store.conversation(window.session.conversation_id).title == "Colours", timeout=5000)
    assert window.windowTitle() == "Colours — SpecChat"


@pytest.mark.slow
def test_an_imported_copy_never_has_its_originals_title(make_window, qtbot, wait_response, quick_settings, tmp_path):
    window = make_window(quick_settings)
    window.input.setPlainText("Name a colour.")
    window.send_message()
    wait_response(window)
    assert window.files.export_conversation(tmp_path / "chat.json")
    first = window.files.import_conversation(tmp_path / "chat.json")
    assert window.store.conversation(first).title == "Name a colour. (imported)"
    assert window.windowTitle() == "Name a colour. (imported) — SpecChat"
    assert window.files.export_conversation(tmp_path / "copy.json")  # the imported one, exported and imported again
    second = window.files.import_conversation(tmp_path / "copy.json")
    titles = [c.title for c in window.store.conversations()]
    assert len(titles) == len(set(titles)) == 3
    assert window.store.conversation(second).title == "Name a colour. (imported 2)"
    assert window.windowTitle() == "Name a colour. (imported 2) — SpecChat"


# --- 4. the export's file name, and the folder the dialogs start in ------------------------------------
def answer_file_dialog(seen: list, choose: Path | None) -> None:
    """When the file dialog shows: note its folder and file name, then choose `choose` (or cancel), as a person."""

    def act() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QFileDialog):
            return QTimer.singleShot(50, act)
        selected = dialog.selectedFiles()
        seen.append((dialog.directory().absolutePath(), Path(selected[0]).name if selected else ""))
        if choose is None:
            return dialog.reject()
        dialog.setDirectory(str(choose.parent))
        dialog.findChild(QLineEdit, "fileNameEdit").setText(choose.name)  # typed into the name field
        dialog.accept()

    QTimer.singleShot(50, act)


@pytest.mark.slow
def test_the_export_name_is_shell_safe_and_the_dialogs_start_where_the_last_file_was(
    make_window, qtbot, wait_response, quick_settings, tmp_path
):
    folder = tmp_path / "exports"
    folder.mkdir()
    window = make_window(replace(quick_settings, max_tokens=4))
    window.input.setPlainText(QUESTION)
    window.send_message()
    wait_response(window)
    assert "`" in window.windowTitle() and "…" in window.windowTitle()  # the title keeps what was typed
    seen = []
    answer_file_dialog(seen, folder / "chat.json")
    action(window, "File → Export conversation…").trigger()
    assert (folder / "chat.json").is_file()
    start, name = seen[0]
    assert Path(start) == Path.home()  # the first time: the home folder (nothing is written there)
    assert re.fullmatch(r"[\w.,+-]+\.md", name) and not name.startswith(("-", ".")), name  # nothing a shell reads
    assert "`" not in name and "…" not in name and ".." not in name and " " not in name
    assert name.startswith("Explain-git-rebase-onto-to-me")  # the title's words, in order

    answer_file_dialog(seen, folder / "chat.json")
    action(window, "File → Import conversation…").trigger()
    assert Path(seen[1][0]) == folder  # where the export went
    window.close()

    settings, _ = load_settings()  # a restart: the folder was saved with the settings
    assert settings.last_folder == str(folder)
    again = make_window(settings)
    answer_file_dialog(seen, None)
    action(again, "File → Export conversation…").trigger()
    assert Path(seen[2][0]) == folder


# --- 5. light, dark or the system's --------------------------------------------------------------
@pytest.mark.slow
def test_the_theme_is_chosen_in_the_view_menu_applied_at_once_and_at_start(
    make_window, qtbot, quick_settings, system_theme
):
    from app.theme import is_dark

    window = make_window(quick_settings)
    system_dark = is_dark(window.palette())
    labels = [label for label, _ in menu_actions(window) if label.startswith("View → Theme → ")]
    assert labels == ["View → Theme → Light", "View → Theme → Dark", "View → Theme → Like the system"]
    assert action(window, "View → Theme → Like the system").isChecked()

    action(window, "View → Theme → Dark").trigger()
    assert is_dark(QApplication.palette())
    qtbot.waitUntil(lambda: is_dark(window.palette()) and is_dark(window.input.palette()), timeout=2000)  # next turn
    assert action(window, "View → Theme → Dark").isChecked()
    assert not action(window, "View → Theme → Like the system").isChecked()
    assert load_settings()[0].theme == "dark"
    window.close()

    QApplication.setPalette(QPalette())  # a new start: the system's colours until the window applies its own
    again = make_window(load_settings()[0])
    assert is_dark(again.palette()) and action(again, "View → Theme → Dark").isChecked()

    action(again, "View → Theme → Light").trigger()
    qtbot.waitUntil(lambda: not is_dark(again.palette()), timeout=2000)
    assert load_settings()[0].theme == "light"
    action(again, "View → Theme → Like the system").trigger()
    qtbot.waitUntil(lambda: is_dark(again.palette()) == system_dark, timeout=2000)
    assert load_settings()[0].theme == "system"


# --- 6. a shortcut copies the last answer ----------------------------------------------------------
@pytest.mark.slow
def test_ctrl_shift_c_copies_the_last_answer(make_window, qtbot, wait_response, quick_settings):
    window = make_window(quick_settings)
    copy = action(window, "Edit → Copy last answer")
    assert copy.shortcut() == QKeySequence("Ctrl+Shift+C")
    QGuiApplication.clipboard().setText("before")
    copy.trigger()
    assert QGuiApplication.clipboard().text() == "before"  # no answer yet: nothing copied, and it says so
    assert "no answer" in window.statusBar().currentMessage()

    for question in ("Name a colour.", "Name a fruit."):
        window.input.setPlainText(question)
        window.send_message()
        wait_response(window)
    answers = [m for m in window.session.model.items if m.role == "assistant"]
    assert len(answers) == 2 and answers[-1].content.strip() != answers[0].content.strip()
    window.activateWindow()
    window.input.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.input, timeout=5000)
    qtbot.keyClick(window.input, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert QGuiApplication.clipboard().text() == answers[-1].content.strip()
