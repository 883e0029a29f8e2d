"""The main window's menu bar: File, Edit, View (the theme), Model and Help, and Help's two texts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMenu, QMessageBox, QWidget

from app.theme import LABELS as THEME_LABELS
from app.theme import apply_theme

if TYPE_CHECKING:
    from app.main_window import MainWindow

FIGURES = (
    "tok/s: decode speed, tokens after the first ÷ time after the first token.\n"
    "TTFT: time to the first token (mostly prompt processing).\n"
    "accepted %: drafted tokens the target kept ÷ drafted tokens it checked (drafted/accepted counts).\n"
    "tok/step: tokens produced per target model step, the bonus token included; 1.00 means "
    "speculation gained nothing.\n"
    "RAM/VRAM: memory in use, labelled by kind; backend: where llama.cpp runs the model.\n\n"
    "Every figure is measured while the response is written; n/a means it could not be measured.\n"
    "Speculative decoding here is lossless: the text has the same distribution as without it."
)
ABOUT = (
    "SpecChat: chat with local GGUF models, faster with lossless speculative decoding, "
    "with honest live figures for every response."
)


def action(menu: QMenu, owner: QWidget, text: str, slot: Callable[[], object], shortcut=None) -> QAction:
    """A menu item that calls slot() when triggered."""
    item = QAction(text, owner)
    # triggered(bool) would hand its `checked` to the slot's first parameter (Export took False as a path).
    item.triggered.connect(lambda _checked=False: slot())
    if shortcut is not None:
        item.setShortcut(shortcut)
    menu.addAction(item)
    return item


class Menus:
    """Builds the window's menu bar; View → Theme's items are kept, one checked."""

    def __init__(self, window: MainWindow):
        self.window = window
        self.theme_actions: dict[str, QAction] = {}
        w, bar = window, window.menuBar()
        file_menu = bar.addMenu("&File")
        action(file_menu, w, "&New chat", w.new_chat, QKeySequence.StandardKey.New)
        action(file_menu, w, "Chat &settings…", w.chat_settings_button.open_dialog)
        file_menu.addSeparator()
        action(file_menu, w, "&Export conversation…", w.files.export_conversation)
        action(file_menu, w, "&Import conversation…", w.files.import_conversation)
        file_menu.addSeparator()
        action(file_menu, w, "&Quit", w.close, QKeySequence.StandardKey.Quit)
        edit_menu = bar.addMenu("&Edit")
        action(edit_menu, w, "&Copy last answer", w.chat.copy_last_answer, QKeySequence("Ctrl+Shift+C"))
        self._build_view_menu(bar.addMenu("&View"))
        model_menu = bar.addMenu("&Model")
        action(model_menu, w, "&Models…", w.tools.open_models_dialog)
        action(model_menu, w, "Speculation &lab…", w.tools.open_lab)
        action(model_menu, w, "&Compare plain vs speculation…", w.tools.open_compare)
        action(model_menu, w, "Se&rver…", w.tools.open_server)
        action(model_menu, w, "&Settings…", w.tools.open_settings, QKeySequence.StandardKey.Preferences)
        model_menu.addSeparator()
        action(model_menu, w, "&Reload model", w.models.load_models)
        help_menu = bar.addMenu("&Help")
        action(help_menu, w, "System &check…", w.tools.open_system_check)
        action(help_menu, w, "About the &figures", self._explain_figures)
        action(help_menu, w, "&About SpecChat", self._about)

    def _build_view_menu(self, view_menu: QMenu) -> None:
        """View → Theme: light, dark or the system's, one checked; applied at once and kept."""
        themes = view_menu.addMenu("&Theme")
        group = QActionGroup(self.window)
        for theme, label in THEME_LABELS.items():
            item = QAction(label, self.window, checkable=True, checked=theme == self.window.settings.theme)
            item.triggered.connect(lambda _checked=False, theme=theme: self.set_theme(theme))
            group.addAction(item)
            themes.addAction(item)
            self.theme_actions[theme] = item

    def set_theme(self, theme: str) -> None:
        apply_theme(theme)
        self.theme_actions[theme].setChecked(True)
        if theme != self.window.settings.theme:
            self.window.store_settings(self.window.settings.merged({"theme": theme}))

    def _explain_figures(self) -> None:
        QMessageBox.information(self.window, "The figures under each response", FIGURES)

    def _about(self) -> None:
        QMessageBox.about(self.window, "About SpecChat", ABOUT)
