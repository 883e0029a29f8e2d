"""Where downloaded models live: ``<data dir>/models/<owner>/<repo>/<filename>`` (engine.paths.data_dir(), so
SPECCHAT_DATA_DIR moves it), each file's path (never outside that folder), and the files beside it: ``.part`` (the
bytes so far), ``.part.json`` (the hub version they belong to), ``.lock`` (one download at a time) and
``.source.json`` (where a finished file came from)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..paths import data_dir, write_text_atomic
from .hub_files import FileRequest, RemoteFile, UnsafePathError, check_repo_id


def models_dir() -> Path:
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def local_path(repo_id: str, filename: str, root: Path | None = None) -> Path:
    """Where a repo file lives once downloaded; refuses names that would escape the models folder."""
    check_repo_id(repo_id)
    parts = _safe_parts(repo_id, filename)
    root = (root or models_dir()).resolve()
    path = root.joinpath(*repo_id.split("/"), *parts)
    if not path.resolve().is_relative_to(root):  # a symlinked folder could still point outside
        raise UnsafePathError(f"Refusing {repo_id}/{filename}: it would be written outside {root}.")
    return path


def source_record_path(path: Path) -> Path:
    return path.with_name(path.name + ".source.json")


def read_source_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(source_record_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def installed_path(request: FileRequest, root: Path | None = None) -> Path | None:
    path = local_path(request.repo_id, request.filename, root)
    return path if path.is_file() else None


def partial_bytes(request: FileRequest, root: Path | None = None) -> int:
    """Bytes already fetched by an unfinished download of this file (0 if none)."""
    part = part_path(local_path(request.repo_id, request.filename, root))
    return part.stat().st_size if part.is_file() else 0


def _safe_parts(repo_id: str, filename: str) -> list[str]:
    refusal = (
        f"Refusing {filename!r} from {repo_id}: a file name must be a relative path inside the repo "
        "(no '..', no absolute or Windows-style path)."
    )
    if not isinstance(filename, str) or not filename or "\x00" in filename or "\\" in filename:
        raise UnsafePathError(refusal)
    if filename.startswith("/") or re.match(r"^[A-Za-z]:", filename):
        raise UnsafePathError(refusal)
    parts = filename.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(refusal)
    return parts


def part_path(path: Path) -> Path:
    return path.with_name(path.name + ".part")


def part_info_path(path: Path) -> Path:
    return path.with_name(path.name + ".part.json")


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def usable_part_size(remote: RemoteFile) -> int:
    """Bytes of an earlier attempt that can be continued: same hub version, not past the end."""
    part = part_path(remote.path)
    if not part.is_file():
        return 0
    info = {}
    try:
        info = json.loads(part_info_path(remote.path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    size = part.stat().st_size
    same_version = isinstance(info, dict) and info.get("etag") == remote.etag and info.get("size") == remote.size
    if not same_version or (remote.size is not None and size > remote.size):
        return 0
    return size


def source_record(remote: RemoteFile) -> dict[str, Any]:
    return {
        "repo_id": remote.request.repo_id,
        "filename": remote.request.filename,
        "revision": remote.request.revision,
        "commit": remote.commit,
        "etag": remote.etag,
        "size": remote.size,
        "endpoint": remote.endpoint,
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))  # a crash leaves the old record or the new one
