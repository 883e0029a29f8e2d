"""Light, dark, or the system's colours, for the whole application (View → Theme; the `theme` setting).

Qt 6.8's QStyleHints.setColorScheme asks the platform for a scheme, and the style's palette follows where the
platform honours it. Where it does not (X11 without a desktop theme plugin, offscreen, older Qt), the colour
scheme stays as it was, so the palette is set here instead: the style's own light one, or DARK below.
"""

from __future__ import annotations

from typing import cast

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from app.settings.values import THEMES

LABELS = {"light": "&Light", "dark": "&Dark", "system": "Like the &system"}
# Role → colour (active and inactive), then the disabled group's own.
DARK = {
    "Window": "#2b2b2b",
    "WindowText": "#e6e6e6",
    "Base": "#1f1f1f",
    "AlternateBase": "#2f2f2f",
    "ToolTipBase": "#3a3a3a",
    "ToolTipText": "#f0f0f0",
    "PlaceholderText": "#9a9a9a",
    "Text": "#e6e6e6",
    "Button": "#353535",
    "ButtonText": "#e6e6e6",
    "BrightText": "#ff6b6b",
    "Light": "#4a4a4a",
    "Midlight": "#3f3f3f",
    "Mid": "#2a2a2a",
    "Dark": "#1a1a1a",
    "Shadow": "#0d0d0d",
    "Highlight": "#3d7bd9",
    "HighlightedText": "#ffffff",
    "Link": "#7fb2ff",
    "LinkVisited": "#c19cff",
}
DARK_DISABLED = {
    "WindowText": "#7a7a7a",
    "Text": "#7a7a7a",
    "ButtonText": "#7a7a7a",
    "Highlight": "#4a4a4a",
    "HighlightedText": "#9a9a9a",
}
_SCHEMES = {"light": Qt.ColorScheme.Light, "dark": Qt.ColorScheme.Dark}


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in DARK.items():
        palette.setColor(getattr(QPalette.ColorRole, role), QColor(colour))
    for role, colour in DARK_DISABLED.items():
        palette.setColor(QPalette.ColorGroup.Disabled, getattr(QPalette.ColorRole, role), QColor(colour))
    return palette


def apply_theme(theme: str) -> None:
    """Colour the application (every window, open or not yet) by theme, one of THEMES; at once."""
    app = cast("QApplication | None", QApplication.instance())  # a QApplication: the app has widgets
    if app is None or theme not in THEMES:
        return
    hints = app.styleHints()
    wanted = _SCHEMES.get(theme)
    if hasattr(hints, "setColorScheme"):  # Qt 6.8+: native dialogs and title bars follow too, where supported
        hints.setColorScheme(wanted) if wanted is not None else hints.unsetColorScheme()
    if wanted is None or (hasattr(hints, "colorScheme") and hints.colorScheme() == wanted):
        app.setPalette(QPalette())  # nothing set: the platform's and the style's own colours, for this scheme
    else:
        app.setPalette(dark_palette() if theme == "dark" else app.style().standardPalette())


def is_dark(palette: QPalette) -> bool:
    """Whether text is drawn light on dark in palette (what a person would call a dark theme)."""
    return (
        palette.color(QPalette.ColorRole.Window).lightness() < palette.color(QPalette.ColorRole.WindowText).lightness()
    )
