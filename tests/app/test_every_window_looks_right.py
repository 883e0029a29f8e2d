"""Every window and dialog the menus open, at its default size: nothing cut off, no needless scroll bar, no error."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QHeaderView, QLabel, QScrollArea, QStyle, QTabWidget

from support.window import menu_actions

pytestmark = pytest.mark.slow  # every window and dialog opened and measured

QUIT = "File → Quit"


def problems_in(window) -> list[str]:
    """What looks wrong in the window as it is shown now, each as 'title: problem'."""
    title = window.windowTitle() or type(window).__name__
    found = []

    def mine(kind) -> list:  # a window parented to this one (Server, Models) is looked at as itself
        return [w for w in window.findChildren(kind) if w.window() is window and w.isVisible()]

    for header in mine(QHeaderView):
        if header.orientation() != Qt.Orientation.Horizontal or header.model() is None:
            continue
        margins = 2 * header.style().pixelMetric(QStyle.PixelMetric.PM_HeaderMargin)  # as Qt sizes to contents
        for section in range(header.count()):
            text = str(header.model().headerData(section, Qt.Orientation.Horizontal, Qt.ItemDataRole.DisplayRole))
            need = max(map(header.fontMetrics().horizontalAdvance, text.split("\n"))) + margins
            if not header.isSectionHidden(section) and header.sectionSize(section) < need:
                name = text.replace("\n", " ")
                found.append(f"column “{name}” is {header.sectionSize(section)} px wide, its header needs {need}")
    for area in mine(QAbstractScrollArea):
        # Lists, tables and logs may scroll down through their content; a scroll area around a whole form may not.
        bars = [area.horizontalScrollBar(), *([area.verticalScrollBar()] if isinstance(area, QScrollArea) else [])]
        for bar in bars:
            asked_for = (
                area.horizontalScrollBarPolicy()
                if bar.orientation() == Qt.Orientation.Horizontal
                else area.verticalScrollBarPolicy()
            ) == Qt.ScrollBarPolicy.ScrollBarAlwaysOn
            if bar.isVisible() and not asked_for:  # a bar shown always is the widget's design, not a misfit
                found.append(f"{type(area).__name__} shows a {bar.orientation().name.lower()} scroll bar")
    for label in mine(QLabel):
        text = label.text()
        if not label.wordWrap() and label.width() < label.sizeHint().width():
            found.append(f"label “{text}” is {label.width()} px wide, its text needs {label.sizeHint().width()}")
        if text.strip().lower().startswith("error") or "went wrong" in text.lower():
            found.append(f"error shown: “{text}”")
    errors = getattr(getattr(window, "notices", None), "notices", [])
    found += [f"error notice: “{n.label.text()}”" for n in errors if n.level == "error"]
    return [f"{title}: {problem}" for problem in found]


def open_windows(main) -> list:
    """The main window and every other window shown now (menus, tooltips and other popups are not windows)."""
    return [main] + [
        w
        for w in QApplication.topLevelWidgets()
        if w.isVisible() and w is not main and w.windowType() not in (Qt.WindowType.Popup, Qt.WindowType.ToolTip)
    ]


def test_every_window_fits_its_default_size(make_window, qtbot, wait_response, answered_dialogs, monkeypatch):  # noqa: F811
    problems, looked_at = {}, set()  # a dict keeps each problem once, in the order found

    def look_at(window) -> None:
        looked_at.add(window.windowTitle())
        problems.update(dict.fromkeys(problems_in(window)))

    # Modal boxes block the menu item until closed: the answered_dialogs closer takes one only once this
    # test has looked at it, a timer turn after it showed (its delayed layouts and column sizes ran).
    real_modal = QApplication.activeModalWidget
    monkeypatch.setattr(
        QApplication,
        "activeModalWidget",
        staticmethod(lambda: box if (box := real_modal()) is not None and box.property("looked_at") else None),
    )

    def look_at_modal() -> None:
        box = real_modal()
        if box is None or box.property("looked_at"):
            return
        if box.property("seen"):
            look_at(box)
            box.setProperty("looked_at", True)
        box.setProperty("seen", True)

    watcher = QTimer(interval=100)
    watcher.timeout.connect(look_at_modal)
    watcher.start()

    window = make_window()
    window.input.setPlainText("Hello")
    window.send_message()
    wait_response(window)  # an answer with its figures: the panels have content
    chat = window.session.conversation_id
    for label, action in [a for a in menu_actions(window) if a[0] != QUIT]:
        if window.session.conversation_id is None:  # "New chat" left an empty one: back to the chat
            window.open_conversation(chat)
        action.trigger()
        qtbot.wait(300)
        qtbot.waitUntil(lambda: real_modal() is None, timeout=10_000)
        if label == "Model → Reload model":
            qtbot.waitUntil(lambda: bool(window.model_info and window.model_info.get("name")), timeout=120_000)
        for shown in open_windows(window):
            look_at(shown)  # then every other page of its tabs
            for tabs in [t for t in shown.findChildren(QTabWidget) if t.window() is shown and t.isVisible()]:
                for page in range(1, tabs.count()):
                    tabs.setCurrentIndex(page)
                    qtbot.wait(100)
                    look_at(shown)
                tabs.setCurrentIndex(0)
    watcher.stop()
    for shown in open_windows(window)[1:]:
        shown.close()
    expected = {
        "Settings",
        "Chat settings",
        "Models",
        "Speculation lab",
        "Compare plain vs speculation",
        "Server",
        "About SpecChat",
        "The figures under each response",
        "System check",
    }
    assert expected <= looked_at, f"not checked: {expected - looked_at}"
    assert not problems, "\n".join(problems)
