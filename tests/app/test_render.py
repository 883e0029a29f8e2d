"""Markdown rendering and the accepted-draft highlight, which must land on the right words."""

import pytest
from PySide6.QtGui import QTextCursor, QTextDocument

from app.chat.render import DRAFT_COLOR, align, render, render_code, shaded_runs

from support.window import highlighted, store_conversation


def test_align_skips_markdown_syntax():
    source = "Some **bold** and `code`."
    rendered = "Some bold and code."
    idx = align(rendered, source)
    assert "".join(source[i] for i in idx if i is not None) == rendered
    assert idx[5] == source.index("bold")


def test_draft_runs_map_source_spans_to_rendered_positions():
    source = "Say **hello world** now"
    start = source.index("hello")
    runs = shaded_runs("Say hello world now", source, [[start, start + len("hello")]])
    assert runs == [(4, 9, DRAFT_COLOR)]


def test_render_highlights_the_drafted_words_through_markdown(qapp):
    source = "# Title\n\nThe **quick** fox\n\n- item one\n- item two\n\n```\ncode line\n```\n"
    spans = [
        [source.index("quick"), source.index("quick") + 5],
        [source.index("one"), source.index("one") + 3],
        [source.index("line"), source.index("line") + 4],
    ]
    doc = QTextDocument()
    render(doc, source, spans, color_drafts=True)
    assert doc.toPlainText().startswith("Title\nThe quick fox")  # markdown rendered, syntax gone
    marks = highlighted(doc)
    shown = "".join(ch for ch in marks if ch != "_")
    assert shown == "quickoneline"
    plain = QTextDocument()
    render(plain, source, spans, color_drafts=False)
    assert set(highlighted(plain)) == {"_"}


def shades(doc: QTextDocument) -> str:
    """Per rendered character: L in the lookup colour, D in the draft model's, _ unshaded."""
    from app.chat.render import DRAFT_MODEL_COLOR

    out = []
    for pos in range(doc.characterCount() - 1):
        c = QTextCursor(doc)
        c.setPosition(pos)
        c.setPosition(pos + 1, QTextCursor.MoveMode.KeepAnchor)
        color = c.charFormat().background().color()
        out.append("L" if color == DRAFT_COLOR else "D" if color == DRAFT_MODEL_COLOR else "_")
    return "".join(out)


def test_each_proposers_drafts_are_shaded_in_its_own_colour(qapp):
    """lookup's accepted drafts (and older answers' spans, which name no proposer) amber, the draft model's blue,
    through the markdown and in a code block."""
    from app.chat.render import DRAFT_MODEL_COLOR

    assert DRAFT_MODEL_COLOR.rgb() != DRAFT_COLOR.rgb()
    source = "The **quick** brown fox jumps\n\n```\ncode line\n```\n"
    at = source.index
    spans = [
        [at("quick"), at("quick") + 5, "lookup"],
        [at("brown"), at("brown") + 9, "draft"],
        [at("jumps"), at("jumps") + 5],
        [at("line"), at("line") + 4, "draft"],
    ]
    doc = QTextDocument()
    render(doc, source, spans, color_drafts=True)
    marks = shades(doc)
    assert doc.toPlainText().startswith("The quick brown fox jumps")
    assert marks[:25] == "____LLLLL_DDDDDDDDD_LLLLL", marks
    assert marks[doc.toPlainText().index("line") :][:4] == "DDDD"
    code = QTextDocument()
    render_code(code, "x = 1; y = 2", [[0, 5, "draft"], [7, 12, "lookup"]])
    assert shades(code) == "DDDDD__LLLLL"


def test_segments_keep_who_proposed_them():
    """The engine's (text, source) segments become spans that name their proposer; True (an older answer's
    "from a draft") names none; the target's own tokens make no span."""
    from app.chat.model import add_segments, span_source
    from app.conversations.store import Message

    m = Message(None, "assistant", "")
    add_segments(
        m,
        [
            ("The", None),
            (" quick", "lookup"),
            (" brown", "lookup"),
            (" fox", "draft"),
            (" ran", False),
            (" far", True),
            (" away", "draft"),
        ],
    )
    assert m.content == "The quick brown fox ran far away"
    assert m.draft_spans == [[3, 15, "lookup"], [15, 19, "draft"], [23, 27], [27, 32, "draft"]]
    assert [span_source(s) for s in m.draft_spans] == ["lookup", "draft", None, "draft"]


def test_plain_mode_keeps_text_as_typed(qapp):
    doc = QTextDocument()
    render(doc, "**not bold** <b>x</b>", None, markdown=False)
    assert doc.toPlainText() == "**not bold** <b>x</b>"


def test_split_blocks_keeps_fences_and_lists_whole():
    from app.chat.render import split_blocks

    source = "Intro para.\n\n```\ncode\n\nmore code\n```\n\n- a\n\n- b\n\n    indented\n\nLast *para*"
    pieces = [source[a:b] for a, b in split_blocks(source)]
    assert "".join(pieces) == source
    assert pieces == [
        "Intro para.\n\n",
        "```\ncode\n\nmore code\n```\n\n",
        "- a\n\n- b\n\n    indented\n\n",
        "Last *para*",
    ]
    assert split_blocks("") == [(0, 0)]


def test_streaming_rerenders_only_the_last_chunk(qtbot):
    from app.chat.message_text import MessageBody

    body = MessageBody()
    qtbot.addWidget(body)
    text = "First paragraph with **bold**.\n\nSecond paragraph.\n\nThird, still being written"
    body.set_content(text[:40], [], False)
    body.set_content(text, [], False)
    first = body.chunks[0]
    first_doc_revision = first.document().revision()
    body.set_content(text + " and more words.", [], False)
    assert len(body.chunks) == 3
    assert body.chunks[0] is first and first.document().revision() == first_doc_revision  # untouched
    assert body.toPlainText().endswith("Third, still being written and more words.")
    assert "bold" in body.toPlainText() and "**" not in body.toPlainText()
    body.set_content("Short now", [], False)  # regenerated: extra chunks go
    assert len(body.chunks) == 1 and body.toPlainText() == "Short now"


# --- code blocks and thoughts, in the real window -------------------------------------------------
import re  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from support.window import STALL_LIMIT_S  # noqa: E402

CODE = 'def greet(name):\n    return f"Hello, {name}!"\n\n\nprint(greet("world"))  # say hi'
ANSWER = f"Here is the function:\n\n```python\n{CODE}\n```\nCall it with any name.\n\n```\nfor i in range(3):\n    print(i)\n```"
THOUGHT_ANSWER = "<think>\nSix sevens: 6, 12, 18, 24, 30, 36, 42.\n</think>\n\n6 × 7 = **42**."


def colours(doc: QTextDocument) -> set[str]:
    return set(re.findall(r'<span style="[^"]*color:(#[0-9a-fA-F]{6})', doc.toHtml()))


def test_code_blocks_are_highlighted_and_copy_puts_exactly_the_code_on_the_clipboard(
    make_window, qtbot, quick_settings
):
    store_conversation(
        ("user", "Write a greeting function.", None), ("assistant", ANSWER, {"tokens_per_s": 50.0, "generated": 40})
    )
    window = make_window(quick_settings)
    answer = window.view.widget_for(1).text.answer
    named, guessed = answer.code_blocks()
    qtbot.waitUntil(lambda: named.highlighted and guessed.highlighted, timeout=10_000)
    assert named.language.text() == "python" and guessed.language.text() == "code"
    assert len(colours(named.text.document())) >= 3  # keywords, strings, comments... in their own colours
    assert len(colours(guessed.text.document())) >= 2  # no language named: guessed (Python) from the code
    assert named.text.document().toPlainText() == CODE
    assert "Call it with any name." in answer.toPlainText()  # the text between the blocks is markdown still

    QApplication.clipboard().clear()
    qtbot.mouseClick(named.copy_button, Qt.MouseButton.LeftButton)
    assert QApplication.clipboard().text() == CODE  # exactly the code: no fences, no language, no extra newline
    assert named.copy_button.text() == "Copied"
    qtbot.mouseClick(guessed.copy_button, Qt.MouseButton.LeftButton)
    assert QApplication.clipboard().text() == "for i in range(3):\n    print(i)"


def test_a_streaming_code_block_is_coloured_only_once_it_is_complete(qtbot):
    from app.chat.message_text import MessageBody

    body = MessageBody()
    qtbot.addWidget(body)
    source = f"Intro.\n```python\n{CODE}"
    body.set_content(source, [], False, final=False)  # the closing fence has not arrived
    block = body.code_blocks()[0]
    qtbot.wait(300)
    assert not block.highlighted and not colours(block.text.document())
    assert block.code == CODE and block.text.document().toPlainText() == CODE  # shown plain meanwhile
    body.set_content(source + "\n```\n", [], False, final=False)
    assert body.code_blocks()[0] is block  # the same widget, not a new one per update
    qtbot.waitUntil(lambda: block.highlighted, timeout=10_000)
    assert colours(block.text.document())


def test_a_streaming_code_block_grows_by_its_new_text_with_its_draft_spans(qtbot):
    """While a block streams, each update adds only its new text (laying 400 lines out again per delta held
    the window ~40 ms): the text and the draft highlight come out as a full render would make them."""
    from app.chat.message_text import MessageBody

    body = MessageBody()
    qtbot.addWidget(body)
    head = "Intro.\n```python\n"
    code = "def f(x):\n    return x + 1\n\nprint(f(2))\n"
    cuts = [12, 20, 31, len(code)]
    drafts = [[len(head) + 4, len(head) + 15], [len(head) + 24, len(head) + 35]]  # the second spans two deltas
    for cut in cuts:
        source = head + code[:cut]
        body.set_content(source, [[a, min(b, len(source))] for a, b in drafts if a < len(source)], True, final=False)
    block = body.code_blocks()[0]
    whole = QTextDocument()
    render_code(whole, block.code, [[a - len(head), b - len(head)] for a, b in drafts])
    assert block.code == code and block.text.document().toPlainText() == whole.toPlainText()
    marks = highlighted(block.text.document())
    assert marks == highlighted(whole) and "f(x):" in marks and "x + 1" not in marks, marks


@pytest.mark.slow
def test_a_thought_is_folded_and_left_out_of_the_next_prompt(make_window, qtbot, wait_response, quick_settings):
    store_conversation(
        ("user", "What is 6 times 7?", None), ("assistant", THOUGHT_ANSWER, {"tokens_per_s": 50.0, "thought_s": 3.24})
    )
    window = make_window(quick_settings)
    shown = window.view.widget_for(1).text
    fold = shown.thought
    assert fold.isVisible() and fold.toggle.text() == "Thought for 3.2 s"  # measured when it was written, saved
    assert not fold.body.isVisible()  # folded
    assert shown.toPlainText() == "6 × 7 = 42." and "Six sevens" not in shown.toPlainText()
    qtbot.mouseClick(fold.toggle, Qt.MouseButton.LeftButton)
    assert fold.body.isVisible() and fold.body.toPlainText() == "Six sevens: 6, 12, 18, 24, 30, 36, 42."
    qtbot.mouseClick(fold.toggle, Qt.MouseButton.LeftButton)
    assert not fold.body.isVisible()
    window.view.widget_for(1).copy_button.click()
    assert QApplication.clipboard().text() == "6 × 7 = **42**."  # the message's Copy: the answer, not the thought

    window.session.send("And 6 times 8?")
    sent = window.session.request.messages
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == "6 × 7 = **42**."  # the answer alone, as the model's own template would send it
    assert not any("<think>" in m["content"] or "Six sevens" in m["content"] for m in sent)
    assert wait_response(window).status == "done"


@pytest.mark.slow
def test_a_live_thought_shows_thinking_then_its_measured_time_which_is_saved(
    make_window, qtbot, wait_response, quick_settings, monkeypatch
):
    from types import SimpleNamespace

    import app.chat.response as response_module
    from engine.decoding.answer import Delta

    window = make_window(replace(quick_settings, max_tokens=8))
    decoder = window.engine.worker.decoder
    real = decoder.generate
    # The window's clock is the test's: it moves only where the generator moves it, once the window has taken in
    # what came before, so the thought's time is exactly what passed between its first text and its closing tag.
    now = [1000.0]
    monkeypatch.setattr(response_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    labels, seen = [], {"<think>": threading.Event(), "</think>": threading.Event()}

    def taken_in(tag: str):
        """Wait until the window has the text up to tag (the engine's loop turning meanwhile, so that its batch
        is handed over as it would be)."""
        for _ in range(6_000):
            if seen[tag].wait(0.01):
                return
            yield Delta(tokens=[], segments=[])
        raise AssertionError(f"the window never showed {tag}")

    def thinks_first(*args, **kwargs):  # the embedded model does not reason: a thought is put before its answer
        now[0] += 5.0  # as prompt processing would: before the first text, not counted
        yield Delta(tokens=[], segments=[("<think>\nThe user says hello", False)])
        yield from taken_in("<think>")
        now[0] += 0.8
        yield Delta(tokens=[], segments=[(", so I greet them.\n</think>\n\n", False)])
        yield from taken_in("</think>")
        now[0] += 3.0  # the answer after the thought: not counted
        yield from real(*args, **kwargs)

    def shown(*_):
        labels.append(window.view.widget_for(window.session.model.rowCount() - 1).text.thought.toggle.text())
        for tag, event in seen.items():
            if tag in window.session.model.items[-1].content:
                event.set()

    decoder.generate = thinks_first
    window.session.model.dataChanged.connect(shown)
    window.session.send("Hello!")
    reply = wait_response(window)
    decoder.generate = real
    assert "Thinking…" in labels
    assert reply.stats["thought_s"] == 0.8, reply.stats  # from the first text to the closing tag
    assert labels[-1] == f"Thought for {reply.stats['thought_s']:.1f} s"
    from app.conversations.store import ConversationStore, default_path

    store = ConversationStore(default_path())
    try:
        saved = store.messages(window.session.conversation_id)[-1]
    finally:
        store.close()
    assert saved.stats["thought_s"] == reply.stats["thought_s"]  # kept with the stats: it survives a restart


@pytest.mark.slow
def test_streaming_a_long_code_block_never_stalls_the_window(
    make_window, qtbot, wait_response, quick_settings, stall_probe, monkeypatch
):
    """The GUI thread's worst stall while a 400-line code block streams in and is then coloured."""
    from engine.decoding.answer import Delta

    lines = [f"    total += values[{i}] * {i}  # step {i}" for i in range(400)]
    text = (
        "Here it is:\n\n```python\ndef total(values):\n    total = 0\n"
        + "\n".join(lines)
        + "\n    return total\n```\n\nThat is all."
    )
    window = make_window(quick_settings)

    def streams_code(*_args, **_kwargs):  # the answer's text is fixed so that it holds a long code block
        for i in range(0, len(text), 60):
            time.sleep(0.004)
            yield Delta(tokens=[], segments=[(text[i : i + 60], False)])

    window.engine.worker.decoder.generate = streams_code
    import app.chat.render as render_module

    lexed_on, lex = [], render_module.code_tokens
    monkeypatch.setattr(render_module, "code_tokens", lambda *a: lexed_on.append(threading.current_thread()) or lex(*a))
    stall_probe.start()
    window.session.send("Write it out in full.")
    reply = wait_response(window)
    block = window.view.widget_for(1).text.answer.code_blocks()[0]
    qtbot.waitUntil(lambda: block.highlighted, timeout=10_000)
    qtbot.wait(100)
    worst = stall_probe.stop()
    assert reply.content == text and block.code.count("\n") == 402
    assert lexed_on and threading.main_thread() not in lexed_on  # the dear part, wherever the stall limit sits
    assert worst < STALL_LIMIT_S, f"the GUI thread worked {worst * 1000:.0f} ms in one go"
