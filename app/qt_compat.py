"""A guard against a PySide6 defect that would crash the app after a few minutes of use.

PySide6 6.12.0 on CPython 3.11 returns None from every C++ method that returns void without
taking a reference to it (fine on 3.12+, where None is immortal). Each such call lowers None's
reference count by one, and after some tens of thousands of calls Python aborts with
"none_dealloc: deallocating None". pyproject.toml excludes that release for Python < 3.12; this
guard protects an installation that has it anyway: when the leak is measured, None is made
effectively immortal, as Python 3.12 does for every interpreter.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)
_PROBE_CALLS = 64
_guarded = False


def none_leaks() -> bool:
    """True when calling a void Qt method loses a reference to None."""
    if sys.version_info >= (3, 12):
        return False
    from PySide6.QtCore import QObject

    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(_PROBE_CALLS):
        probe.setObjectName("")
    return sys.getrefcount(None) < before - _PROBE_CALLS // 2


def guard_none_refcount() -> bool:
    """Make None immortal if this PySide6 leaks it; True if the guard is in place. Safe to call again."""
    global _guarded
    if _guarded or not none_leaks():
        return _guarded
    _guarded = True
    ctypes.c_ssize_t.from_address(id(None)).value += 1 << 60  # never reaches 0; None is never freed anyway
    from PySide6 import __version__

    log.warning(
        "PySide6 %s leaks references to None on Python %s; guarded. Install PySide6 6.11 or a fixed "
        "release to remove this warning.",
        __version__,
        sys.version.split()[0],
    )
    return True
