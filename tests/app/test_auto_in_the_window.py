"""--method auto through the window: a draft chosen in Settings makes auto the method, and the chat answers with it."""
from dataclasses import replace

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from engine.modelfiles.embedded import embedded_model_path

from conftest import PASSAGE


def test_choosing_a_draft_in_settings_makes_auto_the_method_and_the_chat_answers_with_it(
        make_window, qtbot, wait_response, quick_settings):
    window = make_window(replace(quick_settings, max_tokens=24))
    seen = {}

    def choose_a_draft():  # as a person does: the Settings dialog open, a draft file typed in, OK
        dialog = QApplication.activeModalWidget()
        seen["before"] = dialog.method.currentData()
        dialog.draft.edit.setText(str(embedded_model_path()))  # SmolLM2 drafting for itself: same vocabulary
        seen["after"] = dialog.method.currentData()
        dialog.accept()

    QTimer.singleShot(0, choose_a_draft)
    with qtbot.waitSignal(window.speculationChanged, timeout=60_000) as applied:
        window.open_settings()
    assert (seen["before"], seen["after"]) == ("lookup", "auto")
    assert window.settings.method == "auto" and applied.args[0]["method"] == "auto"
    assert window.spec_label.text().startswith("Speculation: lookup + draft model (auto)")

    window.input.setPlainText(PASSAGE)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    reply = wait_response(window)
    assert reply.status == "done" and "lighthouse" in reply.content
    assert reply.stats["method"] == "auto"
    # What drafting cost, under the response: its share of the decoding time and the draft model's weights.
    from app.chat.stats_view import StatsBar

    bar_text = [bar.label.text() for bar in window.findChildren(StatsBar) if bar.isVisible()][-1]
    size = reply.stats["draft_model_bytes"]
    assert 0.8 < size / embedded_model_path().stat().st_size <= 1.0  # the weights: most of the GGUF file
    assert f"draft {size / 2**20:.0f} MiB" in bar_text and "drafting " in bar_text, bar_text
