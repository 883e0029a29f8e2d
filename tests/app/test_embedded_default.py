"""The first launch: the window on default settings chats with the embedded SmolLM2-135M-Instruct, says
honestly what it is, and Gemma 3 270M base stays one setting away."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.settings.values import AppSettings
from app.window.models import EMBEDDED_NOTICE
from engine.modelfiles.embedded import EMBEDDED, EMBEDDED_GEMMA


def test_default_settings_answer_a_simple_question_with_the_embedded_instruct_model(make_window, wait_response):
    settings = replace(AppSettings(), temperature=0.0, max_tokens=32, n_ctx=1024, threads=2)
    assert settings.model == EMBEDDED  # what a first launch uses
    window = make_window(settings)
    assert "135M" in window.model_info["name"] and window.model_info["chat_template"]
    assert "chat template" in window.model_label.text() and "no chat template" not in window.model_label.text()
    notice = next(t for t in window.notices.texts() if "built-in demo model" in t)
    assert notice == EMBEDDED_NOTICE and "SmolLM2 135M Instruct" in notice and "mistakes" in notice

    window.session.send("What is the capital of France? Answer in one sentence.")
    reply = wait_response(window)
    assert reply.status == "done" and "Paris" in reply.content
    assert "Paris" in window.view.widget_for(1).text.toPlainText()  # shown, not only stored


@pytest.mark.slow
def test_gemma_base_model_is_still_a_choice_and_the_demo_notice_goes(make_window, qtbot):
    from app.settings.dialog import SettingsDialog

    window = make_window(replace(AppSettings(), temperature=0.0, max_tokens=16, n_ctx=1024, threads=2))
    dialog = SettingsDialog(replace(window.settings, model=EMBEDDED_GEMMA), window)
    chosen = dialog.collect()  # "embedded-gemma" is a model, not a missing file
    dialog.close()
    assert chosen.model == EMBEDDED_GEMMA
    with qtbot.waitSignal(window.modelLoaded, timeout=120_000) as loaded:
        window.apply_settings(chosen)
    assert loaded.args[0]["name"].lower().startswith("gemma") and not loaded.args[0]["chat_template"]
    assert not any("built-in demo model" in t for t in window.notices.texts())
