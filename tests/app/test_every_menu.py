"""Every menu item, triggered as a person triggers it (QAction.trigger(), the signal a click sends), with file
dialogs answered by this test and message boxes closed as a person would close them. A menu item added later
is covered without a new test. (File → Export once failed at once: triggered(bool) reached its path.)"""

from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QApplication

from app.main_window import MainWindow

from support.window import menu_actions

pytestmark = pytest.mark.slow  # every menu item triggered, one long flow


def test_every_menu_item_works_when_triggered(make_window, qtbot, wait_response, answered_dialogs):
    export, asked, closed = answered_dialogs
    window: MainWindow = make_window()
    window.input.setPlainText("Hello")
    window.send_message()
    wait_response(window)
    chat = window.session.conversation_id
    conversations = len(window.store.conversations())
    actions = menu_actions(window)
    labels = [label for label, _ in actions]
    assert "File → Export conversation…" in labels and "Help → About SpecChat" in labels
    quit_label = "File → Quit"
    for label, action in [a for a in actions if a[0] != quit_label]:
        if window.session.conversation_id is None:  # "New chat" left an empty one: back to the chat, as a person
            window.open_conversation(chat)
        action.trigger()
        qtbot.wait(300)  # slots run, modal boxes open and are closed
        qtbot.waitUntil(lambda: QApplication.activeModalWidget() is None, timeout=10_000)
        errors = [n.label.text() for n in window.notices.notices if n.level == "error"]
        assert not errors, (label, errors)
        if label == "Model → Reload model":
            qtbot.waitUntil(lambda: bool(window.model_info and window.model_info.get("name")), timeout=120_000)
    # What the items did: the export wrote every branch; the import added it back as a new conversation.
    assert "Export conversation" in asked and "Import conversation" in asked
    assert json.loads(export.read_text())["messages"]
    assert len(window.store.conversations()) == conversations + 1
    assert {"The figures under each response", "About SpecChat"} <= set(closed)
    for opened in (
        window.tools.lab,
        window.tools.compare,
        window.tools.server,
        window.tools.models_dialog,
        window.tools.system_check,
    ):
        assert opened is not None and opened.isVisible()
        opened.close()
    dict(actions)[quit_label].trigger()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=30_000)
