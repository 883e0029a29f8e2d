"""Chat window fixes: even draft shading, a steady sidebar while editing, and titles that follow an edit."""

from dataclasses import replace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextDocument

from app.chat.render import render, render_code

from support.window import highlighted


def shaded_runs(doc: QTextDocument) -> list[str]:
    """The text of each run of draft-shaded characters in doc."""
    return [run for run in highlighted(doc).split("_") if run]


def test_draft_shading_neither_starts_nor_ends_on_whitespace(qapp):
    source = "The cat sat on the mat"
    spans = [[source.index(" sat"), source.index(" the")], [source.index(" mat"), len(source)]]  # " sat on", " mat"
    doc = QTextDocument()
    render(doc, source, spans, color_drafts=True)
    assert shaded_runs(doc) == ["sat on", "mat"]  # no edge spaces; the space between the words stays shaded

    code = "x = 1\ny = x + 2\n"
    code_doc = QTextDocument()
    render_code(code_doc, code, [[code.index(" = 1"), code.index("y")], [code.index(" x +"), code.index(" 2")]])
    assert shaded_runs(code_doc) == ["= 1", "x +"]


@pytest.mark.slow
def test_editing_a_message_leaves_the_sidebar_as_wide_as_it_was(make_window, qtbot, wait_response, quick_settings):
    window = make_window(replace(quick_settings, max_tokens=8))
    window.session.send("Name a colour.")
    wait_response(window)
    qtbot.wait(50)
    sizes, width = window.splitter.sizes(), window.panel.width()

    qtbot.mouseClick(window.view.widget_for(0).edit_button, Qt.MouseButton.LeftButton)
    qtbot.wait(50)
    assert window.edit_label.isVisible()
    assert (window.splitter.sizes(), window.panel.width()) == (sizes, width)

    window.chat.cancel_edit()
    qtbot.wait(50)
    assert not window.edit_label.isVisible()
    assert (window.splitter.sizes(), window.panel.width()) == (sizes, width)


def edit_first_question(window, qtbot, wait_response, text: str) -> None:
    """Edit the first message to text and press Enter, as the user would."""
    qtbot.mouseClick(window.view.widget_for(0).edit_button, Qt.MouseButton.LeftButton)
    window.input.setPlainText(text)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    wait_response(window)
    qtbot.wait(50)  # the sidebar reloads in its own turn


def sidebar_title(window) -> str:
    rows = window.panel.model.rows
    return rows[window.panel.model.row_of(window.session.conversation_id)].title


@pytest.mark.slow
def test_editing_the_first_question_retitles_the_chat(make_window, qtbot, wait_response, quick_settings):
    window = make_window(replace(quick_settings, max_tokens=8))
    window.session.send("What is the capital of France?")
    wait_response(window)
    qtbot.wait(50)
    assert sidebar_title(window).startswith("What is the capital")
    edit_first_question(window, qtbot, wait_response, "Name three rivers in Europe.")
    assert sidebar_title(window).startswith("Name three rivers")
    assert window.windowTitle().startswith("Name three rivers")

    window.session.switch_branch(window.session.model.items[0], -1)  # the old question shown: its title again
    qtbot.wait(50)
    assert sidebar_title(window).startswith("What is the capital")


@pytest.mark.slow
def test_a_title_the_user_chose_stays_when_the_first_question_is_edited(
    make_window, qtbot, wait_response, quick_settings
):
    window = make_window(replace(quick_settings, max_tokens=8))
    window.session.send("What is the capital of France?")
    wait_response(window)
    qtbot.wait(50)
    model = window.panel.model
    model.setData(model.index(model.row_of(window.session.conversation_id)), "Geography")  # the sidebar's rename
    edit_first_question(window, qtbot, wait_response, "Name three rivers in Europe.")
    assert sidebar_title(window) == "Geography"
