"""Model → Settings… as a new user meets it: one way to turn speculation off, an error that goes when it no
longer applies (and no scroll bar either way), and GPU layers that say n/a on a llama.cpp build without a GPU."""

from __future__ import annotations

import json

import llama_cpp
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QDialogButtonBox, QLabel

from app.settings.dialog import DEFAULT_SIZE, SettingsDialog
from app.settings.values import AppSettings, load_settings, save_settings, settings_path

MISSING_DRAFT = "/home/someone/models/qwen2.5-0.5b-instruct-q8_0-the-draft-for-speculative-decoding.gguf"


def open_dialog(qtbot, settings: AppSettings) -> SettingsDialog:
    dialog = SettingsDialog(settings)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    return dialog


def click_ok(qtbot, dialog: SettingsDialog) -> None:
    ok = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)
    qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)


def choose_method(dialog: SettingsDialog, label: str) -> None:
    index = dialog.method.findText(label)
    assert index >= 0, f"no method {label!r}"
    dialog.method.setCurrentIndex(index)


def scroll_bars_shown(dialog: SettingsDialog) -> list[str]:
    QApplication.processEvents()
    scroll = dialog.scroll
    return [
        name
        for name, bar in (("vertical", scroll.verticalScrollBar()), ("horizontal", scroll.horizontalScrollBar()))
        if bar.isVisible()
    ]


def shown_texts(dialog: SettingsDialog) -> list[str]:
    return [label.text() for label in dialog.findChildren(QLabel) if label.isVisible()]


# --- 1. one switch for speculation ------------------------------------------------------------
def test_the_check_box_is_the_only_way_to_turn_speculation_off(qtbot, dirs):
    dialog = open_dialog(qtbot, AppSettings())
    methods = [dialog.method.itemText(i) for i in range(dialog.method.count())]
    assert methods == ["Lookup + draft model (auto)", "Draft model", "Prompt lookup"]  # no "Off" beside the box
    assert [dialog.method.itemData(i) for i in range(dialog.method.count())] == ["auto", "draft", "lookup"]

    dialog.speculation.click()
    assert not dialog.method.isEnabled() and not dialog.max_draft.isEnabled()
    click_ok(qtbot, dialog)
    assert dialog.result_settings.effective_method == "none"
    assert dialog.result_settings.decoder_settings().method == "none"


@pytest.mark.parametrize("saved_speculation", [True, False])
def test_saved_settings_with_method_none_still_load_as_off(qtbot, dirs, saved_speculation):
    # A file from when the combo had "Off" (or the lab's "none" advice) still loads, unchanged and unflagged.
    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text(json.dumps({"speculation": saved_speculation, "method": "none"}), encoding="utf-8")
    saved, notices = load_settings()
    assert notices == [] and saved.method == "none" and saved.effective_method == "none"

    dialog = open_dialog(qtbot, saved)
    assert not dialog.speculation.isChecked()  # shown as off
    assert dialog.method.currentText() == "Prompt lookup" and not dialog.method.isEnabled()
    click_ok(qtbot, dialog)
    kept = dialog.result_settings
    assert kept is not None and kept.effective_method == "none"
    save_settings(kept)
    assert load_settings() == (kept, [])  # what the dialog writes reads back as it was

    again = open_dialog(qtbot, saved)
    again.speculation.click()  # ticking the box turns on the method shown
    click_ok(qtbot, again)
    assert again.result_settings.effective_method == "lookup"


# --- 2. an error goes when it no longer applies; no scroll bar --------------------------------
@pytest.mark.parametrize("gpu_build", [False, True], ids=["this build", "a GPU build"])
def test_a_draft_file_error_goes_with_the_draft_method_and_nothing_scrolls(qtbot, dirs, monkeypatch, gpu_build):
    if gpu_build:  # the GPU layers row is a spin box there: a little taller
        monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    dialog = open_dialog(qtbot, AppSettings())
    assert dialog.size().toTuple() == DEFAULT_SIZE
    assert scroll_bars_shown(dialog) == []

    choose_method(dialog, "Draft model")
    dialog.draft.edit.setText(MISSING_DRAFT)
    click_ok(qtbot, dialog)
    assert dialog.isVisible() and dialog.result_settings is None
    assert dialog.error.isVisible() and "does not exist" in dialog.error.text()
    assert dialog.error.height() >= dialog.error.heightForWidth(dialog.error.width())  # the whole message shows
    assert scroll_bars_shown(dialog) == []

    choose_method(dialog, "Prompt lookup")  # the draft file is no longer used
    assert not dialog.error.isVisible()
    assert scroll_bars_shown(dialog) == []
    click_ok(qtbot, dialog)  # and it no longer stops OK: the path is kept for later
    assert dialog.result_settings is not None
    assert (dialog.result_settings.method, dialog.result_settings.draft) == ("lookup", MISSING_DRAFT)


def test_an_error_goes_when_it_is_fixed_and_stays_while_it_is_not(qtbot, dirs):
    draft_file = dirs / "draft.gguf"
    draft_file.write_bytes(b"GGUF")
    dialog = open_dialog(qtbot, AppSettings())
    choose_method(dialog, "Draft model")
    click_ok(qtbot, dialog)
    assert dialog.error.isVisible() and "needs a draft model" in dialog.error.text()

    dialog.draft.edit.setText(MISSING_DRAFT)  # still wrong: the message follows what is wrong now
    assert dialog.error.isVisible() and "does not exist" in dialog.error.text()
    dialog.draft.edit.setText(str(draft_file))
    assert not dialog.error.isVisible()

    dialog.min_draft.setValue(9)
    dialog.max_draft.setValue(4)
    click_ok(qtbot, dialog)
    assert dialog.error.isVisible() and "must not exceed" in dialog.error.text()
    dialog.speculation.click()  # speculation off does not make bad draft lengths good: they are still saved
    assert dialog.error.isVisible()
    dialog.min_draft.setValue(4)
    assert not dialog.error.isVisible()


# --- 3. GPU layers on a build without a GPU backend -------------------------------------------
@pytest.mark.parametrize("saved_layers", [-1, 20])
def test_gpu_layers_say_na_on_a_cpu_only_build_and_keep_the_saved_value(qtbot, dirs, saved_layers):
    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama.cpp build has a GPU backend")
    dialog = open_dialog(qtbot, AppSettings(n_gpu_layers=saved_layers))
    spin = dialog.n_gpu_layers
    assert not (spin.isVisible() and spin.isEnabled()), f"GPU layers offered as {spin.text()!r} without a GPU backend"
    assert "n/a: this llama.cpp build has no GPU backend" in shown_texts(dialog)
    click_ok(qtbot, dialog)
    assert dialog.result_settings.n_gpu_layers == saved_layers  # kept for a GPU build


def test_gpu_layers_are_a_choice_on_a_gpu_build(qtbot, dirs, monkeypatch):
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    dialog = open_dialog(qtbot, AppSettings())
    spin = dialog.n_gpu_layers
    assert spin.isVisible() and spin.isEnabled() and spin.text() == "all"
    assert not any("no GPU backend" in text for text in shown_texts(dialog))
    spin.setValue(12)
    click_ok(qtbot, dialog)
    assert dialog.result_settings.n_gpu_layers == 12
