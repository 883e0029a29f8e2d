"""The context meter under the message box, in the real window with the real embedded model: it counts
what the chat formatter would send (the conversation and the message being written), follows typing, and
warns before sending would leave the oldest messages out."""

from dataclasses import replace

import pytest

from app.chat.context_meter import Measure, warning_text
from engine.chat_format import answer_reserve

from support.window import store_conversation

pytestmark = pytest.mark.slow  # the meter counted over real conversations


def formatter_count(window) -> int:
    """What the chat formatter makes of the conversation plus the draft, counted on the model itself."""
    messages, _ = window.chat.prompt_so_far()
    return len(window.engine.worker.formatter.render(messages)[1])


def wait_measured(qtbot, window, tokens=None):
    """The meter's next result (after typing, it counts once the typing pauses)."""
    qtbot.waitUntil(
        lambda: window.meter.measure is not None and (tokens is None or window.meter.measure.tokens == tokens),
        timeout=30_000,
    )
    return window.meter.measure


def test_meter_counts_the_conversation_and_the_draft_as_the_formatter_does(make_window, qtbot, quick_settings):
    store_conversation(
        ("user", "Name three rivers in Europe.", None),
        ("assistant", "The Danube, the Rhine and the Loire.", {"tokens_per_s": 30.0}),
    )
    window = make_window(quick_settings)
    expected = formatter_count(window)
    m = wait_measured(qtbot, window, expected)
    assert window.meter.count.text() == f"{expected:,} / 1,024 tokens" and not m.drafted
    assert not window.meter.warning.isVisible()

    window.input.setPlainText("And three in Asia, with their lengths in kilometres?")
    with_draft = formatter_count(window)
    assert with_draft > expected
    m = wait_measured(qtbot, window, with_draft)  # updated while typing, from the same formatter
    assert m.drafted and window.meter.count.text() == f"{with_draft:,} / 1,024 tokens"
    assert m.budget == 1024 - answer_reserve(window.session.chat_settings().max_tokens, 1024)


def test_meter_warns_near_the_limit_and_before_the_oldest_turns_are_dropped(
    make_window, qtbot, wait_response, quick_settings
):
    turns = []
    for i in range(4):
        turns += [
            ("user", f"Question {i}: tell me about the history of bridge number {i} in the old town.", None),
            (
                "assistant",
                f"Bridge {i} was built of stone in the year {1500 + i * 37} and rebuilt twice.",
                {"tokens_per_s": 30.0},
            ),
        ]
    store_conversation(*turns)
    window = make_window(replace(quick_settings, n_ctx=256, max_tokens=24))
    m = wait_measured(qtbot, window, formatter_count(window))
    assert 0.85 * m.budget <= m.tokens < m.budget == 256 - 24  # it fits, just
    assert window.meter.warning.isVisible()
    assert (
        window.meter.warning.text() == f"Nearly full: {m.budget - m.tokens:,} tokens left before the oldest "
        "messages are left out."
    )

    # A draft long enough that sending it leaves the oldest turns out: the meter says so, and how many.
    window.input.setPlainText("Now compare all of those bridges with each other, one by one, in detail. " * 3)
    m = wait_measured(qtbot, window, formatter_count(window))
    assert m.tokens > m.budget and m.trimmed > 0
    messages, max_tokens = window.chat.prompt_so_far()
    expected = window.engine.worker.formatter.prompt(messages, answer_reserve(max_tokens, 256)).trimmed
    assert m.trimmed == expected
    assert window.meter.warning.isVisible()
    assert f"leaves the {m.trimmed} oldest messages out" in window.meter.warning.text()

    window.send_message()  # what the meter foretold is what happens
    reply = wait_response(window)
    assert reply.stats["trimmed_messages"] == m.trimmed


def test_warning_texts_for_each_state():
    room = Measure(tokens=100, n_ctx=1000, budget=900, drafted=True)
    assert warning_text(room) == ("", "")
    assert warning_text(replace(room, tokens=800))[0].startswith("Nearly full: 100 tokens left")
    assert warning_text(replace(room, tokens=950, drafted=False))[0].startswith("The context is full")
    assert "the 1 oldest message out" in warning_text(replace(room, tokens=950, trimmed=1))[0]
    assert "does not fit the context even on its own" in warning_text(replace(room, tokens=2000, overflow=True))[0]


def test_meter_counts_again_when_the_chat_settings_change(make_window, qtbot, quick_settings):
    store_conversation(
        ("user", "Name three rivers in Europe.", None),
        ("assistant", "The Danube, the Rhine and the Loire.", {"tokens_per_s": 30.0}),
    )
    window = make_window(quick_settings)
    wait_measured(qtbot, window, formatter_count(window))
    dialog = window.chat_settings_button.open_dialog()
    dialog.system_prompt.setPlainText("You are a geography teacher who answers in full sentences.")
    dialog.accept()
    with_prompt = formatter_count(window)  # the system prompt now goes first
    wait_measured(qtbot, window, with_prompt)
    assert window.meter.count.text().startswith(f"{with_prompt:,} /")
