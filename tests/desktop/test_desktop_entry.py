"""The freedesktop entry and the icons it names: valid, complete, and installable per user."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

from engine import paths

ROOT = Path(__file__).resolve().parents[2]
DESKTOP = ROOT / "packaging" / "specchat.desktop"
INSTALL = ROOT / "packaging" / "install_desktop.sh"
ICONS = ROOT / "resources" / "icons"
VALIDATOR = shutil.which("desktop-file-validate")
needs_validator = pytest.mark.skipif(
    VALIDATOR is None, reason="desktop-file-validate not found: apt-get install -y desktop-file-utils"
)


def entry(path: Path) -> dict[str, str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "[Desktop Entry]"
    return dict(line.split("=", 1) for line in lines[1:] if line and not line.startswith("#"))


def validate(path: Path) -> None:
    out = subprocess.run([VALIDATOR, str(path)], capture_output=True, text=True)
    # rc 0 allows warnings; hints are advice, errors and warnings are not accepted here.
    problems = [line for line in (out.stdout + out.stderr).splitlines() if "error:" in line or "warning:" in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR, checking the signature and every chunk's CRC."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    pos, chunks = 8, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path.name}: bad CRC in {kind!r}"
        chunks.append(kind)
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks, f"{path.name}: {chunks}"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@needs_validator
def test_desktop_file_validates():
    validate(DESKTOP)


def test_desktop_file_names_the_gui_script_and_the_icon():
    keys = entry(DESKTOP)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["gui-scripts"]
    assert keys["Exec"] in scripts and keys["TryExec"] == keys["Exec"]  # install_desktop.sh makes both absolute
    assert keys["Icon"] == "specchat" and keys["Type"] == "Application" and keys["Terminal"] == "false"


@pytest.mark.parametrize("size", paths.ICON_SIZES)
def test_png_icon_at_every_size(size):
    path = paths.icon_path(size)
    assert path == ICONS / f"specchat-{size}.png" and path.is_file()
    assert png_size(path) == (size, size)


def test_svg_icon_is_square_svg():
    root = ET.parse(paths.icon_path(None)).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("viewBox") == "0 0 512 512"


def test_resources_dir_in_a_frozen_bundle(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert paths.resources_dir() == tmp_path / "resources"
    assert paths.icon_path(48) == tmp_path / "resources" / "icons" / "specchat-48.png"


def run_install(home: Path, *args: str, data_home: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env["HOME"] = str(home)
    if data_home is not None:
        env["XDG_DATA_HOME"] = str(data_home)
    return subprocess.run(["bash", str(INSTALL), *args], env=env, capture_output=True, text=True, timeout=60)


def fake_exe(folder: Path) -> Path:
    folder.mkdir(parents=True)
    exe = folder / "specchat"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("use_xdg", [False, True], ids=["home", "xdg_data_home"])
def test_install_desktop_into_a_temporary_home(tmp_path, use_xdg):
    home = tmp_path / "home"
    home.mkdir()
    data = tmp_path / "xdg data" if use_xdg else home / ".local" / "share"
    exe = fake_exe(tmp_path / "a folder with spaces")
    out = run_install(home, "--exec", str(exe), data_home=data if use_xdg else None)
    assert out.returncode == 0, out.stderr

    installed = data / "applications" / "specchat.desktop"
    keys = entry(installed)
    assert keys["Exec"] == f'"{exe}"' and keys["TryExec"] == str(exe)
    assert keys["Icon"] == "specchat"
    if VALIDATOR:
        validate(installed)
    for size in paths.ICON_SIZES:
        icon = data / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "specchat.png"
        assert icon.read_bytes() == paths.icon_path(size).read_bytes()
    assert (data / "icons/hicolor/scalable/apps/specchat.svg").read_bytes() == paths.icon_path(None).read_bytes()

    out = run_install(home, "--uninstall", data_home=data if use_xdg else None)
    assert out.returncode == 0, out.stderr
    left = [p for p in data.rglob("specchat*") if p.is_file()]
    assert not left, left


def test_install_desktop_refuses_a_missing_executable(tmp_path):
    out = run_install(tmp_path, "--exec", str(tmp_path / "nowhere" / "specchat"))
    assert out.returncode == 1 and "no executable" in out.stderr
    assert not (tmp_path / ".local").exists()


def test_install_desktop_defaults_to_the_venv_executable(tmp_path):
    out = run_install(tmp_path)
    venv_exe = ROOT / ".venv" / "bin" / "specchat"
    if venv_exe.exists():
        assert out.returncode == 0, out.stderr
        assert entry(tmp_path / ".local/share/applications/specchat.desktop")["TryExec"] == str(venv_exe)
    else:
        assert out.returncode == 1 and str(venv_exe) in out.stderr
