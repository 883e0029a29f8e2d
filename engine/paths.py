"""Where SpecChat keeps things, by platform convention (platformdirs)."""
from __future__ import annotations

import os
import sys
import threading
import tempfile
from pathlib import Path

import platformdirs

APP_NAME = "SpecChat"


def _dir(env: str, default: str) -> Path:
    # SPECCHAT_*_DIR lets tests and portable installs put everything elsewhere.
    path = Path(os.environ.get(env) or default)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # unwritable or blocked: each read or write there says so, and unwritable_reason tells why
    return path


def cache_dir() -> Path:
    return _dir("SPECCHAT_CACHE_DIR", platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    return _dir("SPECCHAT_DATA_DIR", platformdirs.user_data_dir(APP_NAME, appauthor=False))


def config_dir() -> Path:
    return _dir("SPECCHAT_CONFIG_DIR", platformdirs.user_config_dir(APP_NAME, appauthor=False))


def unwritable_reason(folder: Path) -> str:
    """Why a new file cannot be written in folder (made if missing), in the system's words; "" if it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as probe:
            probe.write(b"x")
            probe.flush()  # a full disk fails here, not at creation
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def resources_dir() -> Path:
    """resources/ beside the packages: in a checkout and an editable install; in the PyInstaller
    bundle it sits at the bundle's root, sys._MEIPASS (packaging/specchat.spec puts it there)."""
    frozen = getattr(sys, "_MEIPASS", None)
    return Path(frozen) / "resources" if frozen else Path(__file__).resolve().parent.parent / "resources"


ICON_SIZES = (16, 32, 48, 64, 128, 256, 512)


def icon_path(size: int | None = 256) -> Path:
    """The app icon: resources/icons/specchat-<size>.png (sizes in ICON_SIZES), or the SVG for None."""
    name = "specchat.svg" if size is None else f"specchat-{size}.png"
    return resources_dir() / "icons" / name


def write_text_atomic(path: Path, text: str) -> None:
    """text in path, through a temporary file beside it, so a crash or a full disk leaves the old file or
    the new one, never half of one. Raises OSError (the temporary file is gone then too)."""
    temp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")  # writers never share one
    try:
        temp.write_text(text, encoding="utf-8", errors="replace")
        os.replace(temp, path)
    except OSError:
        temp.unlink(missing_ok=True)
        raise
