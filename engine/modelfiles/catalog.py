"""The curated catalog of target + draft model pairs (resources/catalog.json), and of models that carry their own
drafter (MTP layers: "drafter": "mtp", no draft file; the chat drafts with the method "mtp").

The catalog is data: this module only reads it and checks each entry has what a download needs,
so a mistake in the file shows up as a clear message rather than a failure halfway through.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..paths import resources_dir

CATALOG_FILE = "catalog.json"
DRAFT_MODEL, MTP = "draft", "mtp"  # what drafts for an entry's target: a draft file, or the target's MTP layers
DRAFTERS = (DRAFT_MODEL, MTP)


class CatalogError(EngineError):
    """The catalog file is missing or an entry is malformed."""


@dataclass(frozen=True)
class ModelFile:
    """One GGUF file in a Hugging Face repo."""

    repo_id: str
    filename: str
    quantization: str
    size_bytes: int  # approximate: the hub's reported size is what downloads check against
    revision: str = "main"


@dataclass(frozen=True)
class CatalogPair:
    id: str
    name: str
    family: str
    chat_template: str  # what the family's chat format looks like; the template itself comes from the GGUF
    note: str
    verified: bool  # repo id and filename confirmed against public references
    target: ModelFile
    draft: ModelFile | None  # None: the target drafts for itself (drafter "mtp")
    drafter: str = DRAFT_MODEL
    confirmed_by: str = ""  # where the repo and file names were confirmed, when the entry says

    @property
    def files(self) -> tuple[ModelFile, ...]:
        return (self.target,) if self.draft is None else (self.target, self.draft)

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def default_catalog_path() -> Path:
    return resources_dir() / CATALOG_FILE


def load_catalog(path: str | Path | None = None) -> list[CatalogPair]:
    path = Path(path) if path else default_catalog_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CatalogError(f"The model catalog {path} is missing.") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CatalogError(f"The model catalog {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), list):
        raise CatalogError(f"The model catalog {path} has no list of 'pairs'.")
    pairs = [_pair(entry, i) for i, entry in enumerate(data["pairs"])]
    ids = [p.id for p in pairs]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise CatalogError(f"The model catalog repeats pair ids: {', '.join(duplicates)}.")
    return pairs


def find_pair(pair_id: str, pairs: list[CatalogPair] | None = None) -> CatalogPair:
    pairs = load_catalog() if pairs is None else pairs
    for pair in pairs:
        if pair.id == pair_id:
            return pair
    raise CatalogError(f"No pair {pair_id!r} in the catalog; known: {', '.join(p.id for p in pairs)}.")


def _pair(entry: object, index: int) -> CatalogPair:
    where = f"catalog entry {index + 1}"
    if not isinstance(entry, dict):
        raise CatalogError(f"{where} is not an object.")
    where = f"catalog entry {entry.get('id', index + 1)!s}"
    text = {key: _text(entry, key, where) for key in ("id", "name", "family", "chat_template", "note")}
    verified = entry.get("verified")
    if not isinstance(verified, bool):
        raise CatalogError(f"{where}: 'verified' must be true or false.")
    drafter = entry.get("drafter", DRAFT_MODEL)
    if drafter not in DRAFTERS:
        raise CatalogError(f"{where}: 'drafter' must be one of {', '.join(DRAFTERS)}, not {drafter!r}.")
    if drafter == MTP and "draft" in entry:
        raise CatalogError(f"{where}: a model that drafts with its MTP layers has no 'draft' file.")
    confirmed_by = entry.get("confirmed_by", "")
    if not isinstance(confirmed_by, str):
        raise CatalogError(f"{where}: 'confirmed_by' must be text.")
    return CatalogPair(
        **text,
        verified=verified,
        target=_file(entry.get("target"), f"{where} target"),
        draft=None if drafter == MTP else _file(entry.get("draft"), f"{where} draft"),
        drafter=drafter,
        confirmed_by=confirmed_by,
    )


def _file(entry: object, where: str) -> ModelFile:
    if not isinstance(entry, dict):
        raise CatalogError(f"{where} is missing.")
    repo_id = _text(entry, "repo_id", where)
    if repo_id.count("/") != 1:
        raise CatalogError(f"{where}: repo_id must look like owner/name, got {repo_id!r}.")
    filename = _text(entry, "filename", where)
    if not filename.lower().endswith(".gguf"):
        raise CatalogError(f"{where}: {filename!r} is not a .gguf file.")
    size = entry.get("size_bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise CatalogError(f"{where}: size_bytes must be a positive whole number.")
    revision = entry.get("revision", "main")
    if not isinstance(revision, str) or not revision:
        raise CatalogError(f"{where}: revision must be a non-empty string.")
    return ModelFile(
        repo_id=repo_id,
        filename=filename,
        quantization=_text(entry, "quantization", where),
        size_bytes=size,
        revision=revision,
    )


def _text(entry: dict[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise CatalogError(f"{where}: '{key}' must be a non-empty string.")
    return value
