"""Markdown rendering and the accepted-draft highlight, which must land on the right words."""
from PySide6.QtGui import QTextCursor, QTextDocument

from app.render import DRAFT_COLOR, align, draft_runs, render


def highlighted(doc: QTextDocument) -> str:
    """The rendered characters that carry the draft highlight."""
    out = []
    for pos in range(doc.characterCount() - 1):
        c = QTextCursor(doc)
        c.setPosition(pos)
        c.setPosition(pos + 1, QTextCursor.MoveMode.KeepAnchor)
        if c.charFormat().background().color() == DRAFT_COLOR:
            out.append(doc.characterAt(pos))
        else:
            out.append("_")
    return "".join(out)


def test_align_skips_markdown_syntax():
    source = "Some **bold** and `code`."
    rendered = "Some bold and code."
    idx = align(rendered, source)
    assert "".join(source[i] for i in idx if i is not None) == rendered
    assert idx[5] == source.index("bold")


def test_draft_runs_map_source_spans_to_rendered_positions():
    source = "Say **hello world** now"
    start = source.index("hello")
    runs = draft_runs("Say hello world now", source, [[start, start + len("hello")]])
    assert runs == [(4, 9)]


def test_render_highlights_the_drafted_words_through_markdown(qapp):
    source = "# Title\n\nThe **quick** fox\n\n- item one\n- item two\n\n```\ncode line\n```\n"
    spans = [[source.index("quick"), source.index("quick") + 5], [source.index("one"), source.index("one") + 3],
             [source.index("line"), source.index("line") + 4]]
    doc = QTextDocument()
    render(doc, source, spans, color_drafts=True)
    assert doc.toPlainText().startswith("Title\nThe quick fox")  # markdown rendered, syntax gone
    marks = highlighted(doc)
    shown = "".join(ch for ch in marks if ch != "_")
    assert shown == "quickoneline"
    plain = QTextDocument()
    render(plain, source, spans, color_drafts=False)
    assert set(highlighted(plain)) == {"_"}


def test_plain_mode_keeps_text_as_typed(qapp):
    doc = QTextDocument()
    render(doc, "**not bold** <b>x</b>", None, markdown=False)
    assert doc.toPlainText() == "**not bold** <b>x</b>"


def test_split_blocks_keeps_fences_and_lists_whole():
    from app.render import split_blocks

    source = ("Intro para.\n\n```\ncode\n\nmore code\n```\n\n- a\n\n- b\n\n    indented\n\nLast *para*")
    pieces = [source[a:b] for a, b in split_blocks(source)]
    assert "".join(pieces) == source
    assert pieces == ["Intro para.\n\n", "```\ncode\n\nmore code\n```\n\n", "- a\n\n- b\n\n    indented\n\n",
                      "Last *para*"]
    assert split_blocks("") == [(0, 0)]


def test_streaming_rerenders_only_the_last_chunk(qtbot):
    from app.message_view import MessageBody

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
