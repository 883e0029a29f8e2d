"""Think blocks: split from the answer as the reasoning models write them, also mid-stream."""

from engine.reasoning import find_thinking, split_thinking, without_thinking


def test_a_closed_think_block_is_split_from_the_answer():
    text = "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nIt is **4**."
    assert split_thinking(text) == ("The user wants 2+2. That is 4.", "It is **4**.", True)
    assert without_thinking(text) == "It is **4**."
    span = find_thinking(text)
    assert text[span.answer_start :] == "It is **4**." and span.closed


def test_while_thinking_the_thought_is_open_and_there_is_no_answer_yet():
    assert split_thinking("<think>\nLet me see, first") == ("Let me see, first", "", False)
    assert split_thinking("  <think>") == ("", "", False)
    assert split_thinking("<thi") == ("", "", False)  # the tag is still arriving: nothing shown as answer yet


def test_template_opened_thought_has_only_the_closing_tag():
    # Newer R1 distill templates end the prompt with "<think>\n", so the response starts inside the thought.
    assert split_thinking("Okay, so 3 * 3.\n</think>\n\n9") == ("Okay, so 3 * 3.", "9", True)


def test_text_without_a_think_block_is_all_answer():
    for text in ("Plain answer.", "", "<b>bold</b>", "Use <think> tags like <think>this</think>.", "<"):
        assert split_thinking(text) == (None, text, True)
        assert find_thinking(text) is None
        assert without_thinking(text) == text


def test_thought_clock_runs_from_the_first_text_to_the_closing_tag():
    from engine.reasoning import ThoughtClock

    clock = ThoughtClock()
    assert clock.update("", 9.0) is None  # nothing arrived yet
    assert clock.update("<think>Hmm", 10.0) is None
    assert clock.update("<think>Hmm, so 4.", 11.5) is None
    assert clock.update("<think>Hmm, so 4.</think>4", 13.25) == 3.25
    assert clock.update("<think>Hmm, so 4.</think>4 it is.", 20.0) == 3.25  # kept once measured
    assert ThoughtClock().update("No thought here.", 1.0) is None
    assert ThoughtClock(seconds=2.0).update("<think>a</think>b", 5.0) == 2.0
