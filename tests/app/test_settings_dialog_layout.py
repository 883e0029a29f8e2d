"""The Settings dialog fits its default size (and its minimum width): no sideways scrolling, and every
button and check box is shown whole inside the scroll area's viewport."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QRect
from PySide6.QtWidgets import QApplication, QCheckBox, QPushButton

from app.settings.dialog import DEFAULT_SIZE, SettingsDialog
from app.settings.values import AppSettings


def shown_rect(widget, viewport) -> QRect:
    return QRect(widget.mapTo(viewport, widget.rect().topLeft()), widget.size())


@pytest.mark.parametrize("width", [DEFAULT_SIZE[0], "minimum"])
def test_the_settings_dialog_fits_without_scrolling_sideways(qtbot, dirs, width):
    long_path = "/home/someone/models/" + "a-very-long-model-file-name-" * 4 + "q4_k_m.gguf"
    dialog = SettingsDialog(AppSettings(model=long_path, draft=long_path))  # long text must not widen it
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    if width == "minimum":
        dialog.resize(dialog.minimumWidth(), DEFAULT_SIZE[1])
    QApplication.processEvents()
    assert dialog.size().toTuple() == (
        (DEFAULT_SIZE[0] if width != "minimum" else dialog.minimumWidth()),
        DEFAULT_SIZE[1],
    )

    scroll = dialog.scroll
    viewport = scroll.viewport()
    assert not scroll.horizontalScrollBar().isVisible()
    assert scroll.horizontalScrollBar().maximum() == 0  # nothing to scroll to, either
    assert scroll.widget().width() <= viewport.width()

    browse = [dialog.target.browse, dialog.draft.browse]
    for button in browse:
        assert viewport.rect().contains(shown_rect(button, viewport)), f"{button.text()} is cut off"
        assert button.width() >= button.sizeHint().width()  # its text is not squeezed either
    for widget in [*scroll.widget().findChildren(QCheckBox), *scroll.widget().findChildren(QPushButton)]:
        rect = shown_rect(widget, viewport)
        assert rect.left() >= 0 and rect.right() <= viewport.rect().right(), f"{widget.text()!r} is cut off"
        assert widget.width() >= widget.sizeHint().width(), f"{widget.text()!r} is squeezed"
