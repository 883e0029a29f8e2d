"""The parts around the chat: the input box, the conversation list, the Settings dialog, the
notices, and the hooks to the Models dialog and the Speculation lab."""

import sys
import types
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QDialog, QMessageBox, QWidget

from app.chat.input_box import ChatInput
from app.conversations.sidebar import ConversationPanel
from app.conversations.store import Message, open_store
from app.settings.dialog import SettingsDialog
from app.settings.values import AppSettings, load_settings, what_changed


def test_enter_sends_and_shift_enter_adds_a_line(qtbot):
    box = ChatInput()
    qtbot.addWidget(box)
    sent = []
    box.sendRequested.connect(lambda: sent.append(box.toPlainText()))
    qtbot.keyClicks(box, "line one")
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(box, "line two")
    assert box.toPlainText() == "line one\nline two" and sent == []
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert sent == ["line one\nline two"]


def test_conversation_list_search_rename_delete(qtbot, dirs):
    store, _ = open_store()
    a = store.create_conversation("Bread baking")
    b = store.create_conversation("Kyoto trip")
    store.add_message(a, Message(None, "user", "how long to proof sourdough"))
    panel = ConversationPanel(store)
    qtbot.addWidget(panel)
    assert [r.title for r in panel.model.rows] == ["Bread baking", "Kyoto trip"]  # most recently active first
    chosen = []
    panel.conversationSelected.connect(chosen.append)
    panel.list.setCurrentIndex(panel.model.index(1))
    assert chosen == [b]

    panel.search.setText("sourdough")
    qtbot.waitUntil(lambda: [r.id for r in panel.model.rows] == [a], timeout=2000)
    panel.search.clear()
    qtbot.waitUntil(lambda: len(panel.model.rows) == 2, timeout=2000)

    assert panel.model.setData(panel.model.index(panel.model.row_of(b)), "Japan, spring")
    assert store.conversation(b).title == "Japan, spring"
    assert not panel.model.setData(panel.model.index(0), "   ")  # an empty name is refused
    deleted = []
    panel.deleted.connect(deleted.append)
    panel.delete(b, confirm=False)
    assert deleted == [b] and [r.id for r in panel.model.rows] == [a] and store.conversation(b) is None


def test_settings_dialog_round_trip_and_refuses_bad_input(qtbot, dirs):
    original = AppSettings(temperature=0.4, seed=3, threads=4, method="lookup", window_geometry="abc")
    dialog = SettingsDialog(original)
    qtbot.addWidget(dialog)
    assert dialog.collect() == original  # shows exactly what it was given
    dialog.max_draft.setValue(6)
    dialog.threads.setValue(0)
    assert dialog.flash_attention.currentText() == "automatic"
    dialog.flash_attention.setCurrentText("on")
    dialog.accept()
    assert dialog.result() == QDialog.DialogCode.Accepted
    got = dialog.result_settings
    # Sampling is per chat now (tests/app/test_presets.py): the app's values pass through unchanged.
    assert (got.temperature, got.max_draft, got.seed, got.threads, got.window_geometry) == (0.4, 6, 3, None, "abc")
    assert got.flash_attention is True and got.decoder_settings().load_settings().flash_attention is True
    assert what_changed(replace(got, flash_attention=None), got) == "reload"

    bad = SettingsDialog(original)
    qtbot.addWidget(bad)
    bad.min_draft.setValue(9)  # more than max draft tokens
    bad.max_draft.setValue(4)
    bad.accept()
    assert bad.result_settings is None and not bad.error.isHidden()  # the dialog stays open, saying why
    assert "must not exceed" in bad.error.text()
    bad.min_draft.setValue(1)
    bad.method.setCurrentIndex(bad.method.findData("draft"))  # no draft model chosen
    bad.accept()
    assert bad.result_settings is None and "needs a draft model" in bad.error.text()
    bad.draft.edit.setText(str(dirs / "missing-draft.gguf"))
    bad.accept()
    assert bad.result_settings is None and "does not exist" in bad.error.text()


class FakeModelsDialog(QDialog):
    modelsChosen = Signal(str, object)
    made = []

    def __init__(self, current_target, current_draft, parent=None):
        super().__init__(parent)
        FakeModelsDialog.made.append((current_target, current_draft))


class FakeLab(QWidget):
    applySettings = Signal(dict)

    def set_chat_models(self, *chat) -> None:  # the window tells the lab what the chat runs
        self.chat = chat


def test_models_and_lab_hooks(make_window, qtbot, monkeypatch, dirs, quick_settings):
    window = make_window(quick_settings)
    monkeypatch.setitem(sys.modules, "app.models.dialog", types.SimpleNamespace(ModelsDialog=FakeModelsDialog))
    monkeypatch.setitem(sys.modules, "app.lab.window", types.SimpleNamespace(LabWindow=FakeLab))

    window.tools.open_models_dialog()
    assert FakeModelsDialog.made[-1] == (quick_settings.model, None)
    draft = dirs / "draft.gguf"
    draft.write_bytes(b"not a model")
    reloads = []
    window.modelLoaded.connect(reloads.append)
    with qtbot.waitSignal(window.speculationChanged, timeout=60_000):
        window.tools.models_dialog.modelsChosen.emit(quick_settings.model, str(draft))  # same target: no reload
    assert reloads == []
    assert (window.settings.draft, window.settings.method) == (str(draft), "auto")  # a pair: lookup + draft
    assert load_settings()[0].draft == str(draft)  # saved
    qtbot.waitUntil(lambda: any("Speculation is off" in t for t in window.notices.texts()), timeout=10_000)

    window.tools.open_lab()
    with qtbot.waitSignal(window.speculationChanged, timeout=10_000):
        window.tools.lab.applySettings.emit({"method": "lookup", "max_draft": 8})
    assert (window.settings.method, window.settings.max_draft, window.settings.speculation) == ("lookup", 8, True)
    assert any("lab's recommendation" in t for t in window.notices.texts())
    window.tools.lab.applySettings.emit({"max_draft": 999})
    assert window.settings.max_draft == 8
    assert any("could not be applied" in t for t in window.notices.texts())


def test_missing_models_dialog_or_lab_says_so(make_window, monkeypatch, quick_settings):
    window = make_window(quick_settings)
    monkeypatch.setitem(sys.modules, "app.models.dialog", None)  # import fails
    monkeypatch.setitem(sys.modules, "app.lab.window", None)
    warnings = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: warnings.append((title, text)))
    window.tools.open_models_dialog()
    window.tools.open_lab()
    assert [t for t, _ in warnings] == ["Models", "Speculation lab"]
    assert "could not be opened" in warnings[0][1] and window.isVisible()


def test_settings_notices_are_shown_in_the_window(make_window, dirs, quick_settings):
    from app.settings.values import settings_path

    settings_path().write_text("{broken")
    settings, notices = load_settings()
    window = make_window(
        replace(settings, **{k: getattr(quick_settings, k) for k in ("n_ctx", "threads")}), notices=notices
    )
    assert any("could not be read" in t for t in window.notices.texts())
    assert any("built-in demo model" in t for t in window.notices.texts())  # first launch explains itself
    assert window.notices.isVisible()


@pytest.mark.slow
def test_long_conversation_opens_a_page_at_a_time(qtbot):
    import time

    from app.chat.message_view import PAGE, ChatView
    from app.chat.model import ChatModel

    model = ChatModel()
    view = ChatView()
    qtbot.addWidget(view)
    view.setModel(model)
    view.resize(800, 600)
    view.show()
    answer = "Some **markdown** with `code`.\n\n```python\nprint('hi')\n```\n\n- a\n- b\n"
    messages = [
        Message(
            i,
            "user" if i % 2 == 0 else "assistant",
            f"message {i}\n\n" + answer,
            stats={"tokens_per_s": 10.0 + i, "method": "lookup"},
        )
        for i in range(300)
    ]
    started = time.perf_counter()
    model.set_messages(messages)
    opened = time.perf_counter() - started
    print(f"\nopening 300 messages took {opened * 1000:.0f} ms ({PAGE} rendered)")
    assert len(view.widgets) == PAGE and view.more_button.isVisible()
    assert view.widget_for(299).stats.text().startswith("309.0 tok/s")
    qtbot.waitUntil(lambda: view.verticalScrollBar().value() == view.verticalScrollBar().maximum() > 0)
    qtbot.mouseClick(view.more_button, Qt.MouseButton.LeftButton)
    assert len(view.widgets) == 2 * PAGE and view.first_row == 300 - 2 * PAGE
    assert f"message {300 - 2 * PAGE}" in view.widget_for(300 - 2 * PAGE).text.toPlainText()
    model.remove_from(298)
    assert len(view.widgets) == 2 * PAGE - 2 and view.widget_for(298) is None


@pytest.mark.qt_no_exception_capture
def test_an_unexpected_error_in_a_slot_is_shown_and_the_app_goes_on(make_window, qtbot, monkeypatch, quick_settings):
    from PySide6.QtCore import QTimer

    from app.__main__ import _install_excepthook

    window = make_window(quick_settings)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # restored after the test
    _install_excepthook(window, smoke=False)

    def broken_slot():
        raise ValueError("a bug in a slot")

    QTimer.singleShot(0, broken_slot)
    qtbot.waitUntil(lambda: any("a bug in a slot" in t for t in window.notices.texts()), timeout=5000)
    assert window.isVisible()
