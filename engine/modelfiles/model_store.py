"""Installed models and the pairs they make.

Two kinds of installed model: files downloaded into the models folder (engine.modelfiles.downloads), and GGUF
files elsewhere on disk that the user added (by hand, or found in another app's folder by
engine.modelfiles.local_discovery); those are only remembered (in local_models.json in the data dir), never
copied or deleted. The list holds a path string per file, or {"path", "name"} where a display name is kept
(an Ollama blob's file name is its digest): older lists of plain strings read as they are, and entries this
version cannot read are kept on rewrite. Whether a draft can serve a target is engine.decoding.pair_check's
(llama.cpp's vocabulary check on vocab-only loads).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelFileError
from ..paths import data_dir
from .catalog import CatalogPair, ModelFile, load_catalog
from .gguf_header import read_gguf_header
from .hub_files import FileRequest
from .model_folder import installed_path, models_dir, partial_bytes, read_source_record, source_record_path

REGISTRY_FILE = "local_models.json"
DOWNLOADED = "downloaded"
LOCAL = "local"


@dataclass(frozen=True)
class InstalledModel:
    path: Path
    size_bytes: int
    origin: str  # DOWNLOADED or LOCAL
    repo_id: str | None = None
    display_name: str | None = None  # kept for an added file, e.g. an Ollama model's name:tag

    @property
    def name(self) -> str:
        return self.display_name or self.path.name

    @property
    def location(self) -> Path:
        return self.path.parent


@dataclass(frozen=True)
class InstalledPair:
    pair: CatalogPair
    target: Path
    draft: Path | None  # None: the target drafts with its own MTP layers


def list_models() -> list[InstalledModel]:
    """Downloaded models first, then added local files; each sorted by name."""
    root = models_dir()
    downloaded = []
    for path in sorted(root.rglob("*.gguf"), key=lambda p: p.name.lower()):
        if path.is_file():
            record = read_source_record(path) or {}
            repo_id = record.get("repo_id") or "/".join(path.relative_to(root).parts[:2])
            downloaded.append(InstalledModel(path, path.stat().st_size, DOWNLOADED, repo_id))
    local = [
        InstalledModel(p, p.stat().st_size, LOCAL, display_name=name)
        for p, name in _registered().items()
        if p.is_file()
    ]
    return downloaded + sorted(local, key=lambda m: m.name.lower())


def add_local_model(path: str | Path, name: str | None = None) -> InstalledModel:
    """Remember a GGUF file where it is, with a display name if given (else its file name is shown); raises
    ModelFileError saying what is wrong with a bad file. The GGUF header is checked, not the suffix: an
    Ollama blob has none. Adding a remembered file again keeps it once, renamed if a new name is given."""
    path = Path(path).expanduser().resolve()
    header = read_gguf_header(path)
    if path.is_relative_to(models_dir().resolve()):
        return InstalledModel(path, header.size_bytes, DOWNLOADED)
    name = (name.strip() or None) if isinstance(name, str) else None
    entries, registered = _read_registry()
    if path not in registered or (name and registered[path] != name):
        registered[path] = name or registered.get(path)
        _write_registry(registered, entries)
    return InstalledModel(path, header.size_bytes, LOCAL, display_name=registered[path])


def display_name(path: str | Path) -> str | None:
    """The name an added file was given where it was found (an Ollama model's name:tag), or None."""
    try:
        return _registered().get(Path(path).expanduser().resolve())
    except ModelFileError:  # a damaged list of models names nothing; it is said where the list is shown
        return None


def delete_model(path: str | Path) -> bool:
    """Delete a downloaded model from disk (True), or forget an added local file, keeping it (False)."""
    path = Path(path).expanduser().resolve()
    root = models_dir().resolve()
    if path.is_relative_to(root) and path != root:
        if not path.is_file():
            raise ModelFileError(f"{path} is not an installed model.")
        path.unlink()
        source_record_path(path).unlink(missing_ok=True)
        _remove_empty_folders(path.parent, root)
        return True
    entries, registered = _read_registry()
    if path not in registered:
        raise ModelFileError(f"{path} is not an installed model.")
    del registered[path]
    _write_registry(registered, entries)
    return False


def installed_pairs(pairs: Iterable[CatalogPair] | None = None) -> list[InstalledPair]:
    """Catalog pairs whose files (target and draft, or a target with MTP layers) are all downloaded."""
    ready = []
    for pair in load_catalog() if pairs is None else pairs:
        paths = [installed_path(_request(f)) for f in pair.files]
        if all(paths) and paths[0] is not None:
            ready.append(InstalledPair(pair, paths[0], paths[1] if len(paths) > 1 else None))
    return ready


def pair_state(pair: CatalogPair) -> str:
    """'installed', 'partial' (a download was interrupted) or 'absent'."""
    requests = [_request(f) for f in pair.files]
    if all(installed_path(r) for r in requests):
        return "installed"
    if any(installed_path(r) or partial_bytes(r) for r in requests):
        return "partial"
    return "absent"


def catalog_requests(pair: CatalogPair) -> list[FileRequest]:
    return [_request(f) for f in pair.files]


# --- internals ---------------------------------------------------------------------------------
def _request(model_file: ModelFile) -> FileRequest:
    return FileRequest(model_file.repo_id, model_file.filename, model_file.revision)


def _registry_path() -> Path:
    return data_dir() / REGISTRY_FILE


def _registered() -> dict[Path, str | None]:
    return _read_registry()[1]


def _read_registry() -> tuple[list[Any], dict[Path, str | None]]:
    """The list as stored, and the files it names with their display names (None: the file name)."""
    try:
        entries = json.loads(_registry_path().read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [], {}
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"The list of added models {_registry_path()} cannot be read: {exc}") from exc
    if not isinstance(entries, list):
        raise ModelFileError(f"The list of added models {_registry_path()} is damaged (not a list).")
    registered: dict[Path, str | None] = {}
    for entry in entries:
        parsed = _parse_entry(entry)
        if parsed:
            registered[parsed[0]] = parsed[1]
    return entries, registered


def _parse_entry(entry: object) -> tuple[Path, str | None] | None:
    if isinstance(entry, str) and entry:
        return Path(entry), None
    if isinstance(entry, dict) and isinstance(entry.get("path"), str) and entry["path"]:
        name = entry.get("name")
        return Path(entry["path"]), (name.strip() or None) if isinstance(name, str) else None
    return None  # not ours to read (damaged, or a later version's): kept as it is, never dropped


def _write_registry(registered: dict[Path, str | None], entries: list[Any]) -> None:
    unread = [e for e in entries if _parse_entry(e) is None]
    known = [str(p) if name is None else {"path": str(p), "name": name} for p, name in registered.items()]
    target = _registry_path()
    temp = target.with_name(target.name + ".tmp")
    temp.write_text(json.dumps(known + unread, indent=2), encoding="utf-8")
    os.replace(temp, target)  # never a half-written list


def _remove_empty_folders(folder: Path, root: Path) -> None:
    while folder != root and folder.is_relative_to(root):
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (another model, or a download in progress)
        folder = folder.parent
