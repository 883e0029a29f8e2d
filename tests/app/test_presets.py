"""Presets and per-chat settings: the presets file, the Chat settings dialog in the real window, and the
requests each chat sends to the real embedded model."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QInputDialog, QMessageBox

from app.settings.presets import DEFAULT_NAME, Preset, PresetBook, load_presets, presets_path
from app.settings.values import AppSettings, settings_path
from engine.errors import InvalidSettingError

pytestmark = pytest.mark.slow  # chats restarted and answered with each preset


def answer_name(monkeypatch, name: str) -> None:
    """The next 'Preset name' prompt is answered with name (a modal prompt would block the test)."""
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: (name, True)))


def pick(qtbot, dialog, name: str) -> None:
    """Choose a preset in the dialog's list with the keyboard, as a person would."""
    combo = dialog.preset
    target = combo.findData(name)
    assert target >= 0, f"no preset {name!r}"
    while combo.currentIndex() != target:
        qtbot.keyClick(combo, Qt.Key.Key_Down if combo.currentIndex() < target else Qt.Key.Key_Up)


def capture_requests(window, monkeypatch) -> list:
    """Every GenerationRequest the window's session hands to the engine (which still runs it)."""
    sent, real = [], window.engine.generate

    def generate(request):
        sent.append(request)
        return real(request)

    monkeypatch.setattr(window.engine, "generate", generate)
    return sent


# --- the book and its file (no window) ---------------------------------------------------------
def test_without_a_file_the_default_preset_is_made_from_the_app_settings(dirs):
    settings = AppSettings(temperature=0.3, top_k=12, seed=5, max_tokens=77, system_prompt="Be brief.")
    book, notices = load_presets(settings)
    assert notices == [] and book.names() == [DEFAULT_NAME] and book.default == DEFAULT_NAME
    assert book.default_preset == Preset(
        DEFAULT_NAME,
        system_prompt="Be brief.",
        temperature=0.3,
        top_k=12,
        top_p=settings.top_p,
        min_p=settings.min_p,
        seed=5,
        max_tokens=77,
    )
    assert not presets_path().exists()  # nothing is written until a preset is saved


def test_a_conversation_follows_its_preset_with_its_own_values_over_it(dirs):
    book = PresetBook([Preset("Default", temperature=0.8), Preset("Precise", temperature=0.0, top_k=1)], "Default")
    assert book.effective({}) == book.default_preset  # {} = the default preset as it is
    got = book.effective({"preset": "Precise", "temperature": 0.4, "seed": 9})
    assert (got.name, got.temperature, got.top_k, got.seed) == ("Precise", 0.4, 1, 9)
    assert book.overrides({"preset": "Precise", "temperature": 0.4, "top_k": 1}) == {"temperature": 0.4}
    # A bad stored value is ignored, and a preset that is gone means the default one.
    assert book.effective({"preset": "Precise", "temperature": "hot"}).temperature == 0.0
    assert book.effective({"preset": "Gone", "top_k": 3}) == Preset("Default", temperature=0.8, top_k=3)


def test_names_must_be_distinct_and_the_last_preset_stays(dirs):
    book = PresetBook.built_in(AppSettings())
    with pytest.raises(InvalidSettingError, match="already a preset"):
        book.put(Preset("default"))  # names differ by case only
    with pytest.raises(InvalidSettingError, match="needs a name"):
        book.put(Preset("  "))
    with pytest.raises(InvalidSettingError, match="temperature"):
        book.put(Preset("Wild", temperature=9.0))
    with pytest.raises(InvalidSettingError, match="last preset"):
        book.delete(DEFAULT_NAME)
    book.put(Preset("Wild", temperature=2.0))
    book.set_default("Wild")
    book.rename("Wild", "Hot")
    assert (book.names(), book.default) == ([DEFAULT_NAME, "Hot"], "Hot")
    book.delete("Hot")
    assert (book.names(), book.default) == ([DEFAULT_NAME], DEFAULT_NAME)  # the default moves to one that is left


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"presets": 3}', '{"presets": []}'])
def test_an_unreadable_presets_file_is_set_aside_and_the_default_preset_is_used(dirs, content):
    path = presets_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    book, notices = load_presets(AppSettings(temperature=0.2))
    assert book.names() == [DEFAULT_NAME] and book.default_preset.temperature == 0.2
    assert len(notices) == 1 and "presets file" in notices[0] and "Default preset is in use" in notices[0]
    kept = list(path.parent.glob("presets.corrupt-*.json"))
    assert len(kept) == 1 and kept[0].read_text(encoding="utf-8") == content and kept[0].name in notices[0]
    assert not path.exists()


def test_invalid_presets_and_values_are_reset_and_the_file_kept_as_it_was(dirs):
    path = presets_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    content = json.dumps(
        {
            "default": ["not", "a", "name"],
            "presets": [
                {"name": "Good", "temperature": 0.1, "seed": 4},
                {"name": "Odd", "temperature": "hot", "top_k": -1, "max_tokens": 50},
                {"temperature": 0.5},
                {"name": "good"},
                "junk",
            ],
        }
    )
    path.write_text(content, encoding="utf-8")
    book, notices = load_presets(AppSettings(temperature=0.7, top_k=33))
    assert book.names() == ["Good", "Odd"] and book.default == "Good"
    assert (book.get("Good").temperature, book.get("Good").seed, book.get("Good").top_k) == (0.1, 4, 33)
    odd = book.get("Odd")
    assert (odd.temperature, odd.top_k, odd.max_tokens) == (0.7, 33, 50)  # only the bad values fall back
    text = " ".join(notices)
    assert "3 preset(s)" in text and "Odd: temperature, Odd: top k" in text
    kept = list(path.parent.glob("presets.invalid-*.json"))
    assert len(kept) == 1 and kept[0].read_text(encoding="utf-8") == content and kept[0].name in text


# --- the real window ---------------------------------------------------------------------------
def test_presets_saved_edited_and_made_default_survive_a_restart(
    make_window, qtbot, monkeypatch, quick_settings, wait_response
):
    window = make_window(quick_settings)
    assert window.chat_settings_button.text() == "Preset: Default"
    assert window.chat_settings_button.isVisible()

    qtbot.mouseClick(window.chat_settings_button, Qt.MouseButton.LeftButton)
    dialog = window.chat_settings_button.dialog
    assert dialog.isVisible() and dialog.temperature.value() == 0.0  # the Default preset, from the app settings
    dialog.temperature.setValue(1.1)
    dialog.system_prompt.setPlainText("Answer like a pirate.")
    assert "temperature" in dialog.changes.text() and "system prompt" in dialog.changes.text()
    answer_name(monkeypatch, "Pirate")
    qtbot.mouseClick(dialog.save_new, Qt.MouseButton.LeftButton)
    assert dialog.preset.currentData() == "Pirate" and "as saved" in dialog.changes.text()
    pick(qtbot, dialog, "Default")  # picking a preset shows its values
    assert (dialog.temperature.value(), dialog.system_prompt.toPlainText()) == (0.0, "")
    pick(qtbot, dialog, "Pirate")
    assert (dialog.temperature.value(), dialog.system_prompt.toPlainText()) == (1.1, "Answer like a pirate.")
    dialog.top_k.setValue(7)
    qtbot.mouseClick(dialog.save_to, Qt.MouseButton.LeftButton)  # edit the preset
    qtbot.mouseClick(dialog.make_default, Qt.MouseButton.LeftButton)
    answer_name(monkeypatch, "Sea dog")
    qtbot.mouseClick(dialog.rename, Qt.MouseButton.LeftButton)
    assert [dialog.preset.itemText(i) for i in range(dialog.preset.count())] == ["Default", "Sea dog (default)"]
    dialog.seed.setText("11")  # this chat's own value on top of the preset
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
    assert not dialog.isVisible()
    assert window.chat_settings_button.text() == "Preset: Sea dog (changed)"
    assert "seed" in window.chat_settings_button.toolTip()

    window.session.send("Hello")  # the unsaved chat keeps what was chosen for it once it is saved
    wait_response(window)
    cid = window.session.conversation_id
    assert window.store.conversation_settings(cid) == {"preset": "Sea dog", "seed": 11}
    saved = json.loads(presets_path().read_text(encoding="utf-8"))
    assert presets_path().parent == settings_path().parent and saved["default"] == "Sea dog"
    window.close()

    again = make_window(quick_settings, wait_loaded=False)
    assert again.presets.names() == ["Default", "Sea dog"] and again.presets.default == "Sea dog"
    assert again.presets.get("Sea dog") == Preset(
        "Sea dog",
        system_prompt="Answer like a pirate.",
        temperature=1.1,
        top_k=7,
        top_p=quick_settings.top_p,
        min_p=quick_settings.min_p,
        seed=None,
        max_tokens=quick_settings.max_tokens,
    )
    assert again.session.conversation_id == cid and again.chat_settings_button.text() == "Preset: Sea dog (changed)"
    again.new_chat()
    assert again.chat_settings_button.text() == "Preset: Sea dog"  # new chats start from the default preset
    settings = again.session.chat_settings()
    assert (settings.temperature, settings.top_k, settings.system_prompt) == (1.1, 7, "Answer like a pirate.")

    # Deleting a preset: its chats follow the default one; the last preset cannot go.
    dialog = again.chat_settings_button.open_dialog()
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.StandardButton.Yes))
    qtbot.mouseClick(dialog.delete, Qt.MouseButton.LeftButton)
    assert again.presets.names() == ["Default"] and not dialog.delete.isEnabled()
    assert dialog.temperature.value() == quick_settings.temperature  # shows the preset it now follows
    dialog.reject()
    assert json.loads(presets_path().read_text(encoding="utf-8"))["presets"][0]["name"] == "Default"
    again.open_conversation(cid)
    assert again.chat_settings_button.text() == "Preset: Default (changed)"  # its own seed is kept


def test_two_chats_send_their_own_system_prompt_and_sampling(
    make_window, qtbot, monkeypatch, wait_response, quick_settings
):
    # Speculation off: a fixed seed then repeats an answer exactly (README, Settings).
    window = make_window(AppSettings(temperature=0.0, max_tokens=24, n_ctx=1024, threads=2, speculation=False))
    sent = capture_requests(window, monkeypatch)
    question = "Write a short poem about the sea."

    # Chat A: the Default preset (greedy), with a system prompt of its own.
    dialog = window.chat_settings_button.open_dialog()
    dialog.system_prompt.setPlainText("You are a ship's captain. Answer in one sentence.")
    dialog.accept()
    window.session.send(question)
    answer_a = wait_response(window).content
    chat_a = window.session.conversation_id

    # Chat B: a hot, seeded preset and no system prompt.
    window.new_chat()
    dialog = window.chat_settings_button.open_dialog()
    dialog.temperature.setValue(1.5)
    dialog.seed.setText("7")
    dialog.system_prompt.setPlainText("")
    answer_name(monkeypatch, "Hot")
    dialog.save_as_new()
    dialog.accept()
    assert window.chat_settings_button.text() == "Preset: Hot"
    window.session.send(question)
    answer_b = wait_response(window).content
    chat_b = window.session.conversation_id

    a, b = sent
    assert a.messages[0] == {"role": "system", "content": "You are a ship's captain. Answer in one sentence."}
    assert (a.sampling.temperature, a.sampling.seed) == (0.0, None)
    assert [m["role"] for m in b.messages] == ["user"]  # A's system prompt did not leak into B
    assert (b.sampling.temperature, b.sampling.seed) == (1.5, 7)
    assert answer_a and answer_b and answer_a != answer_b

    # Back in each chat, its own settings again, and the same answers: greedy, and a fixed seed.
    window.open_conversation(chat_a)
    assert window.chat_settings_button.text() == "Preset: Default (changed)"
    assert window.session.regenerate()
    assert wait_response(window).content == answer_a
    window.open_conversation(chat_b)
    assert window.session.regenerate()
    assert wait_response(window).content == answer_b
    assert [(r.sampling.temperature, r.messages[0]["role"]) for r in sent[2:]] == [(0.0, "system"), (1.5, "user")]

    # B's seed changed for this chat only: a different answer, and preset Hot itself is unchanged.
    dialog = window.chat_settings_button.open_dialog()
    dialog.seed.setText("8")
    dialog.accept()
    assert window.session.regenerate()
    assert wait_response(window).content != answer_b and sent[-1].sampling.seed == 8
    assert window.presets.get("Hot").seed == 7


def test_a_corrupt_presets_file_is_set_aside_with_a_notice_in_the_window(
    make_window, qtbot, quick_settings, monkeypatch
):
    path = presets_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xfe{ garbage")
    window = make_window(quick_settings, wait_loaded=False)
    assert any("presets file could not be read" in t for t in window.notices.texts())
    assert len(list(path.parent.glob("presets.corrupt-*.json"))) == 1
    assert window.chat_settings_button.text() == "Preset: Default"
    dialog = window.chat_settings_button.open_dialog()  # and presets work again: a fresh file is written
    answer_name(monkeypatch, "Fresh")
    dialog.save_as_new()
    assert not dialog.error.isVisible()
    assert [p["name"] for p in json.loads(path.read_text(encoding="utf-8"))["presets"]] == ["Default", "Fresh"]


def test_bad_input_in_the_dialog_is_refused_and_loses_nothing(make_window, qtbot, monkeypatch, quick_settings):
    window = make_window(quick_settings, wait_loaded=False)
    dialog = window.chat_settings_button.open_dialog()
    dialog.system_prompt.setPlainText("Keep me.")
    dialog.seed.setText("twelve")
    dialog.accept()
    assert dialog.result() != QDialog.DialogCode.Accepted and dialog.isVisible()
    assert "whole number" in dialog.error.text() and dialog.system_prompt.toPlainText() == "Keep me."
    answer_name(monkeypatch, "default")  # the name is taken (case aside)
    dialog.seed.setText("")
    dialog.save_as_new()
    assert "already a preset" in dialog.error.text() and window.presets.names() == ["Default"]
    assert not presets_path().exists()
