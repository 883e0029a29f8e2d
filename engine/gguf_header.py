"""Checks a file looks like a complete GGUF model before llama.cpp sees it.

llama.cpp can abort the whole process on some malformed files, so the cheap checks happen here:
the magic, a supported version, sane counts, and a size large enough to hold something.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata key/value count
_MIN_MODEL_BYTES = 1024


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    tensor_count: int
    metadata_count: int
    size_bytes: int


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Return the header of a GGUF file or raise ModelFileError saying what is wrong with it."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"Model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"Not a file: {path}")
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            raw = f.read(_HEADER.size)
    except OSError as exc:
        raise ModelFileError(f"Cannot read model file {path}: {exc.strerror or exc}") from exc
    if len(raw) < _HEADER.size:
        raise ModelFileError(f"{path.name} is too short to be a GGUF model ({size} bytes).")
    magic, version, tensors, kvs = _HEADER.unpack(raw)
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{path.name} is not a GGUF model (it starts with {magic!r}, not b'GGUF'). "
            "SpecChat runs llama.cpp GGUF files; convert or download a .gguf build of the model."
        )
    if version not in SUPPORTED_VERSIONS:
        raise ModelFileError(f"{path.name} uses GGUF version {version}; supported: 2 and 3.")
    if tensors == 0 or tensors > 1_000_000 or kvs > 1_000_000:
        raise ModelFileError(f"{path.name} has an implausible GGUF header (tensors={tensors}, keys={kvs}).")
    if size < _MIN_MODEL_BYTES:
        raise ModelFileError(f"{path.name} is truncated ({size} bytes).")
    return GGUFHeader(version=version, tensor_count=tensors, metadata_count=kvs, size_bytes=size)
