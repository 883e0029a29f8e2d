"""--method auto through the window: a draft chosen in Settings makes auto the method, and the chat answers with it."""

from dataclasses import replace

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from engine.modelfiles.embedded import embedded_model_path

from support.window import PASSAGE

pytestmark = pytest.mark.slow  # auto answers with a draft model in the window


def test_choosing_a_draft_in_settings_makes_auto_the_method_and_the_chat_answers_with_it(
    make_window, qtbot, wait_response, quick_settings
):
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
        window.tools.open_settings()
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


def shades_in(body) -> set[int]:
    """The background colours (as rgba) of every character of a message body's chunks."""
    from PySide6.QtGui import QTextCursor

    found = set()
    for chunk in body.chunks:
        doc = chunk.text.document() if hasattr(chunk, "code") else chunk.document()
        for pos in range(doc.characterCount() - 1):
            cursor = QTextCursor(doc)
            cursor.setPosition(pos)
            cursor.setPosition(pos + 1, QTextCursor.MoveMode.KeepAnchor)
            brush = cursor.charFormat().background()
            if brush.style() != Qt.BrushStyle.NoBrush:
                found.add(brush.color().rgba())
    return found


def test_an_auto_answer_shows_who_did_the_work_in_words_and_in_two_shades(
    make_window, qtbot, wait_response, quick_settings
):
    """Under an auto answer: drafted and accepted per proposer (a draft model that proposed nothing says so),
    and with shading on each proposer's accepted drafts in its own colour, with the legend that says which."""
    from app.chat.model import span_source
    from app.chat.render import DRAFT_COLOR, DRAFT_MODEL_COLOR
    from app.chat.stats_view import StatsBar
    from app.figure_texts import proposer_counts

    window = make_window(replace(quick_settings, method="auto", draft=str(embedded_model_path()), max_tokens=32))
    window.input.setPlainText(PASSAGE)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    reply = wait_response(window)
    assert reply.status == "done" and reply.stats["method"] == "auto"
    assert "by_proposer" in reply.stats
    by = proposer_counts(reply.stats)  # the engine's counts; under auto one that never drafted reads as 0/0
    assert set(by) == {"lookup", "draft"}, by
    assert sum(c["drafted"] for c in by.values()) == reply.stats["drafted"]
    assert sum(c["accepted"] for c in by.values()) == reply.stats["accepted"]

    shown = window.view.widget_for(len(window.session.model.items) - 1)
    line = shown.findChild(StatsBar).label.text()
    for name, counts in by.items():
        words = f"{name} {counts['accepted']}/{counts['drafted']}"
        assert words in line, line
        if counts["drafted"] == 0:
            assert words + " (proposed nothing)" in line, line
    assert "proposed nothing" in shown.findChild(StatsBar).label.toolTip() or all(c["drafted"] for c in by.values())

    # The spans name the proposers whose drafts were kept, and only those.
    assert {span_source(s) for s in reply.draft_spans} == {name for name, c in by.items() if c["accepted"]}
    assert not shown.legend.isVisible()
    qtbot.mouseClick(window.color_toggle, Qt.MouseButton.LeftButton)
    assert shown.legend.isVisible()
    assert shown.legend.shown() == ["from prompt lookup", "from the draft model"]
    colours = shades_in(shown.text.answer)
    assert (DRAFT_COLOR.rgba() in colours) == bool(by["lookup"]["accepted"])
    assert (DRAFT_MODEL_COLOR.rgba() in colours) == bool(by["draft"]["accepted"])
