"""Where SpecChat keeps things, by platform convention (platformdirs)."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path

import platformdirs

APP_NAME = "SpecChat"
# Settings (a server's API key), conversations and the log are the user's alone: on POSIX their files are made
# 0600 and the folders holding them 0700, whatever the umask; ones an older version made looser are tightened.
PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700


def _dir(env: str, default: str, private: bool = False) -> Path:
    # SPECCHAT_*_DIR lets tests and portable installs put everything elsewhere.
    path = Path(os.environ.get(env) or default)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # unwritable or blocked: each read or write there says so, and unwritable_reason tells why
    if private:
        make_private(path, PRIVATE_DIR)
    return path


def cache_dir() -> Path:
    return _dir("SPECCHAT_CACHE_DIR", platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    """Conversations, the log and downloaded models: private (PRIVATE_DIR)."""
    return _dir("SPECCHAT_DATA_DIR", platformdirs.user_data_dir(APP_NAME, appauthor=False), private=True)


def config_dir() -> Path:
    """Settings and presets: private (PRIVATE_DIR)."""
    return _dir("SPECCHAT_CONFIG_DIR", platformdirs.user_config_dir(APP_NAME, appauthor=False), private=True)


def make_private(path: Path | str, mode: int = PRIVATE_FILE) -> None:
    """Take away what group and others may do with path (a file: PRIVATE_FILE, a folder: PRIVATE_DIR), if it is
    ours and exists. POSIX only; a failure is left to the reads and writes that follow to tell."""
    if os.name != "posix":
        return
    try:
        st = os.stat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, (st.st_mode & 0o7777 & ~0o077) | (mode & 0o700))
    except OSError:
        pass


def private_opener(path: str, flags: int) -> int:
    """An opener for open(): a file it creates is PRIVATE_FILE from the start (never readable by others, not
    even for a moment); an existing one is tightened."""
    fd = os.open(path, flags, PRIVATE_FILE)
    if os.name == "posix":
        try:
            st = os.fstat(fd)
            if st.st_mode & 0o077:
                os.fchmod(fd, st.st_mode & 0o7777 & ~0o077)
        except OSError:
            pass
    return fd


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


def write_text_atomic(path: Path, text: str, private: bool = False) -> None:
    """text in path, through a temporary file beside it, so a crash or a full disk leaves the old file or
    the new one, never half of one. private: the file is PRIVATE_FILE. Raises OSError (the temporary file is
    gone then too)."""
    temp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")  # writers never share one
    try:
        with open(temp, "w", encoding="utf-8", errors="replace", opener=private_opener if private else None) as f:
            f.write(text)
        os.replace(temp, path)
    except OSError:
        temp.unlink(missing_ok=True)
        raise
