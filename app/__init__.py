"""SpecChat's desktop app (PySide6). The engine it drives lives in engine/ and never imports Qt."""

from app.qt_compat import guard_none_refcount

guard_none_refcount()  # before any window exists: see qt_compat
