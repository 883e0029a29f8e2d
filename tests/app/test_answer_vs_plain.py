"""Each answer says, under it, how it compares with plain decoding (the engine's estimate, labelled one), and
the guard's words when it backed off; with shading on, each proposer's drafts have their own colour and the
legend under the answer says which is which (issue 52)."""

from dataclasses import replace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from app.chat.render import DRAFT_COLOR, DRAFT_MODEL_COLOR
from app.figure_texts import vs_plain_text

from support.window import PASSAGE

pytestmark = pytest.mark.slow  # answers measured against plain decoding


def stats_line(window, row: int) -> tuple[str, str]:
    """(text, tooltip) of the stats line under the message in row, as shown."""
    bar = window.view.widget_for(row).stats
    assert bar.isVisible()
    return bar.label.text(), bar.label.toolTip()


def store_conversation(*messages):
    """A conversation saved before the window opens (the window opens the newest): Message objects."""
    from app.conversations.store import ConversationStore, default_path

    store = ConversationStore(default_path())
    cid = store.create_conversation("Saved")
    for m in messages:
        store.add_message(cid, m)
    store.close()


def test_a_real_answer_says_how_it_compares_with_plain_decoding(make_window, qtbot, wait_response, quick_settings):
    window = make_window(replace(quick_settings, method="lookup", max_tokens=32))
    window.input.setPlainText(PASSAGE)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    reply = wait_response(window)
    assert reply.status == "done"
    speedup = reply.stats["speedup_vs_plain"]  # the engine's estimate, measured on this machine (or None)
    assert speedup is None or 0 < speedup < 20
    text, tip = stats_line(window, len(window.session.model.items) - 1)
    shown = vs_plain_text(speedup)
    assert shown in text and (" plain" in shown), text
    assert f"{shown}: An estimate" in tip and "predicted from this machine's measured" in tip, tip


def test_the_guards_words_and_an_answer_without_an_estimate_are_shown(make_window, quick_settings):
    from app.conversations.store import Message

    store_conversation(
        Message(None, "user", "Say hi."),
        Message(
            None,
            "assistant",
            "Hi there.",
            stats={
                "method": "lookup",
                "tokens_per_s": 50.0,
                "speedup_vs_plain": 0.91,
                "guard": "backed off: ran at 0.91× plain",
            },
        ),
        Message(None, "user", "Again."),
        Message(None, "assistant", "Hi again.", stats={"method": "lookup", "tokens_per_s": 48.0}),
    )  # saved earlier
    window = make_window(quick_settings)
    guarded, tip = stats_line(window, 1)
    assert "≈0.91× plain" in guarded and "backed off: ran at 0.91× plain" in guarded, guarded
    assert "backed off: ran at 0.91× plain: Speculation stops for a while" in tip, tip
    older, _ = stats_line(window, 3)
    assert "vs plain n/a" in older and "backed off" not in older, older


def shade_of(doc, word: str):
    """The background colour of word's first character in doc, None when unshaded."""
    pos = doc.toPlainText().index(word)
    cursor = QTextCursor(doc)
    cursor.setPosition(pos)
    cursor.setPosition(pos + 1, QTextCursor.MoveMode.KeepAnchor)
    brush = cursor.charFormat().background()
    return brush.color() if brush.style() != Qt.BrushStyle.NoBrush else None


def test_shading_shows_each_proposer_in_its_colour_with_a_legend(make_window, qtbot, quick_settings):
    from app.conversations.store import Message

    text = "The granite lighthouse stood on the island for ninety years."
    at = text.index
    spans = [
        [at("granite"), at("granite") + 18, "lookup"],
        [at("island"), at("island") + 6, "draft"],
        [at("ninety"), at("ninety") + 12],
    ]  # the last saved before spans named their proposer
    store_conversation(
        Message(None, "user", "Tell me about the lighthouse."),
        Message(None, "assistant", text, draft_spans=spans, stats={"method": "auto", "tokens_per_s": 40.0}),
    )
    window = make_window(replace(quick_settings, color_drafts=False))
    shown = window.view.widget_for(1)
    doc = shown.text.answer.chunks[0].document()
    assert shade_of(doc, "granite") is None and not shown.legend.isVisible()  # shading off: no shades, no legend

    qtbot.mouseClick(window.color_toggle, Qt.MouseButton.LeftButton)  # as a person turns it on
    assert window.color_toggle.isChecked()
    doc = shown.text.answer.chunks[0].document()
    assert shade_of(doc, "granite") == DRAFT_COLOR and shade_of(doc, "lighthouse") == DRAFT_COLOR
    assert shade_of(doc, "island") == DRAFT_MODEL_COLOR
    assert shade_of(doc, "ninety") == DRAFT_COLOR  # proposer not recorded: the colour shading always had
    assert shade_of(doc, "stood") is None  # the target's own words
    assert shown.legend.isVisible()
    assert shown.legend.shown() == [
        "from prompt lookup",
        "from the draft model",
        "from accepted drafts (proposer not recorded)",
    ]

    qtbot.mouseClick(window.color_toggle, Qt.MouseButton.LeftButton)
    assert not shown.legend.isVisible() and shade_of(shown.text.answer.chunks[0].document(), "island") is None
