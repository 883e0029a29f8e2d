"""Checks a file looks like a complete GGUF model before llama.cpp sees it.

llama.cpp can abort the whole process on some malformed files, so the cheap checks happen here:
the magic, a supported version, sane counts, a size large enough to hold something, and (in
metadata_problem) the header values llama.cpp asserts on instead of refusing.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from .. import safe_files
from ..errors import ModelFileError
from ..safe_files import FileRefused, Wording

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata key/value count
_MIN_MODEL_BYTES = 1024
MODEL_FILE = Wording(  # a model path's refusals (engine.safe_files checks it)
    folder="{label} is a folder, not a model file: choose the .gguf file in it.",
    special=(
        "{label} is {kind}, not a regular file, so it was not loaded (reading it could wait for ever or never "
        "end). A model must be a .gguf file."
    ),
    unreadable="Cannot read model file {label}: {why}.",
)


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    tensor_count: int
    metadata_count: int
    size_bytes: int


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Return the header of a GGUF file or raise ModelFileError saying what is wrong with it. Only a regular file
    is opened (engine.safe_files): a FIFO, a device or a folder is refused before llama.cpp is handed it."""
    path = Path(path)
    with open_model(path) as (f, size):
        try:
            raw = f.read(_HEADER.size)
        except OSError as exc:
            raise ModelFileError(f"Cannot read model file {path}: {exc.strerror or exc}") from exc
    return parse_gguf_header(raw, size, path.name)


@contextmanager
def open_model(path: Path) -> Iterator[tuple[BinaryIO, int]]:
    """(the opened model file, its size), checked to be a regular file; ModelFileError saying why not."""
    try:
        with safe_files.open_regular(path, wording=MODEL_FILE) as (f, _):
            yield f, os.fstat(f.fileno()).st_size
    except FileRefused as exc:
        if exc.reason == safe_files.MISSING:
            raise ModelFileError(f"Model file not found: {path}") from exc
        raise ModelFileError(str(exc)) from exc


def parse_gguf_header(raw: bytes, size: int, name: str) -> GGUFHeader:
    """The header from a file's first bytes (a local file's or a remote one's); size is the whole file's."""
    if len(raw) < _HEADER.size:
        raise ModelFileError(f"{name} is too short to be a GGUF model ({size} bytes).")
    magic, version, tensors, kvs = _HEADER.unpack_from(raw)
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{name} is not a GGUF model (it starts with {magic!r}, not b'GGUF'). "
            "SpecChat runs llama.cpp GGUF files; convert or download a .gguf build of the model."
        )
    if version not in SUPPORTED_VERSIONS:
        raise ModelFileError(f"{name} uses GGUF version {version}; supported: 2 and 3.")
    if tensors == 0 or tensors > 1_000_000 or kvs > 1_000_000:
        raise ModelFileError(f"{name} has an implausible GGUF header (tensors={tensors}, keys={kvs}).")
    if size < _MIN_MODEL_BYTES:
        raise ModelFileError(f"{name} is truncated ({size} bytes).")
    return GGUFHeader(version=version, tensor_count=tensors, metadata_count=kvs, size_bytes=size)


# --- metadata -----------------------------------------------------------------------------------
# Scalar value types of GGUF key/values: type id -> struct format.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_SKIPPED_ARRAYS = ("tokenizer.ggml.scores", "tokenizer.ggml.merges")  # large, never checked: sized only
MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS (src/llama-hparams.h)
MAX_EXPERTS = 1024
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # llama.cpp's LLAMA_ROPE_SCALING_TYPES
MAX_ARRAY_STRINGS = 10_000_000  # 40x the largest vocabulary in use (262k): more means a damaged header


class GGUFSource(Protocol):
    """Where a GGUF file's bytes come from: a local file, or a remote one read with HTTP range requests."""

    size: int  # the whole file's, in bytes

    def read(self, at: int, n: int) -> bytes | mmap.mmap:
        """At least n bytes from offset `at` (fewer only where the file ends); it may hand back more."""


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Every key/value of a GGUF file's header (arrays as lists; the big skipped ones as their length)."""
    return _read(path, tensors=False)[0]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int  # ggml_type's number (GGML_TYPE_Q4_K = 12)
    shape: tuple[int, ...]  # ne[0], ne[1], ...: ne[1] is a weight matrix's rows


def read_gguf_tensors(path: str | Path) -> list[TensorInfo]:
    """The name, type and shape of every tensor a GGUF file declares (its data is not read; nor is its
    vocabulary, whose 150k strings took 0.4 s of a 0.43 s read)."""
    return _read(path, tensors=True)[1]


def read_gguf_layout(path: str | Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    """The metadata (the vocabulary's strings stepped over: its length kept) and every tensor's name, type and
    shape, in one read of the header."""
    return _read(path, tensors=True)


def parse_gguf(source: GGUFSource, name: str, tensors: bool = False) -> tuple[dict[str, Any], list[TensorInfo]]:
    """The metadata (with token strings; or, with tensors, the tensor list without them) of the GGUF
    file that source reads. name is what messages call the file."""
    reader = _Reader(source, name, keep_strings=not tensors)
    header = parse_gguf_header(reader.data[: _HEADER.size], source.size, name)
    meta = reader.key_values(header.metadata_count)
    return meta, reader.tensor_infos(header.tensor_count) if tensors else []


def _read(path: str | Path, tensors: bool) -> tuple[dict[str, Any], list[TensorInfo]]:
    path = Path(path)
    read_gguf_header(path)  # its own messages for a missing, short or foreign file
    with open_model(path) as (f, _):
        source = _MappedFile(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    try:
        return parse_gguf(source, path.name, tensors)
    finally:
        source.close()


class _MappedFile:
    """A local file mapped into memory. The first read hands back the whole mapping (no copy), so the
    parser never asks again and slices the mapping directly, as fast as before sources existed."""

    def __init__(self, data: mmap.mmap):
        self._data, self.size = data, len(data)

    def read(self, at: int, n: int) -> bytes | mmap.mmap:
        return self._data if at == 0 else self._data[at : at + n]

    def close(self) -> None:
        self._data.close()


_U64 = struct.Struct("<Q")


def _struct(fmt: str, _cache: dict[str, struct.Struct] = {}) -> struct.Struct:  # noqa: B006 - the default is the cache
    unpacker = _cache.get(fmt)
    if unpacker is None:
        unpacker = _cache[fmt] = struct.Struct("<" + fmt)
    return unpacker


class _Reader:
    def __init__(self, source: GGUFSource, name: str, keep_strings: bool = True):
        self.source, self.name = source, name
        self.keep_strings = keep_strings  # False: string arrays (a vocabulary) are stepped over, their length kept
        self.data = source.read(0, _HEADER.size)  # the file's first bytes, as far as read so far
        self.at = _HEADER.size

    def _need(self, end: int) -> None:
        """Make self.data reach `end` (a remote source fetches more; a mapped file has it all)."""
        if end <= len(self.data):
            return
        if end > self.source.size:
            raise ModelFileError(f"{self.name} is truncated inside its metadata.")
        more = self.source.read(len(self.data), end - len(self.data))
        self.data = bytes(self.data) + bytes(more)
        if end > len(self.data):
            raise ModelFileError(f"{self.name} is truncated inside its metadata.")

    def _check_count(self, key: str, count: int, item_bytes: int, what: str) -> None:
        """Refuse a count the rest of the file cannot hold before any loop runs over it."""
        left = self.source.size - self.at
        if what == "strings" and count > MAX_ARRAY_STRINGS:
            raise ModelFileError(
                f"{self.name} is damaged: its metadata {key} claims {count:,} strings "
                f"(more than {MAX_ARRAY_STRINGS:,} is never a real model)."
            )
        if count * item_bytes > left:
            raise ModelFileError(
                f"{self.name} is truncated or damaged: its metadata {key} claims {count:,} "
                f"{what}, more than the rest of the file ({left:,} bytes) can hold."
            )

    def _take(self, fmt: str) -> Any:
        unpacker = _struct(fmt)
        end = self.at + unpacker.size
        if end > len(self.data):
            self._need(end)
        value = unpacker.unpack_from(self.data, self.at)
        self.at = end
        return value[0] if len(value) == 1 else value

    def _string(self) -> bytes:
        n = self._take("Q")
        end = self.at + n
        if end > len(self.data):
            self._need(end)
        self.at = end
        return self.data[end - n : end]

    def _strings(self, count: int) -> list[bytes]:
        """count strings in a row: the hot loop (a 262k vocabulary), so it works on locals."""
        out: list[bytes] = []
        data, at, length = self.data, self.at, _U64.unpack_from
        have = len(data)
        for _ in range(count):
            if at + 8 > have:
                self._need(at + 8)
                data, have = self.data, len(self.data)
            end = at + 8 + length(data, at)[0]
            if end > have:
                self._need(end)
                data, have = self.data, len(self.data)
            out.append(data[at + 8 : end])
            at = end
        self.at = at
        return out

    def _skip_strings(self, count: int) -> int:
        """Step over count strings, keeping only how many there were (faster still: no slicing)."""
        data, at, length = self.data, self.at, _U64.unpack_from
        have = len(data)
        for _ in range(count):
            if at + 8 > have:
                self._need(at + 8)
                data, have = self.data, len(self.data)
            at += 8 + length(data, at)[0]
        self._need(at)
        self.at = at
        return count

    def _value(self, kind: int, key: str) -> Any:
        if kind in _SCALARS:
            return self._take(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise ModelFileError(f"{self.name} has a metadata value of unknown type {kind} ({key}).")
        item, count = self._take("IQ")
        if item in _SCALARS:
            fmt = _SCALARS[item]
            size = struct.calcsize(fmt)
            self._check_count(key, count, size, "entries")
            self._need(self.at + size * count)
            self.at += size * count
            if key in _SKIPPED_ARRAYS:
                return count
            return list(_struct(f"{count}{fmt}").unpack_from(self.data, self.at - size * count))
        if item == _STRING:
            self._check_count(key, count, 8, "strings")  # each string is at least its 8-byte length
            if self.keep_strings and key not in _SKIPPED_ARRAYS:
                return self._strings(count)
            return self._skip_strings(count)
        raise ModelFileError(f"{self.name} has an array of unsupported type {item} ({key}).")

    def key_values(self, count: int) -> dict[str, Any]:
        self._check_count("header", count, 8 + 4, "keys")  # a key is at least its length and a type
        out = {}
        for _ in range(count):
            key = self._string().decode("utf-8", "replace")
            out[key] = self._value(self._take("I"), key)
        return out

    def tensor_infos(self, count: int) -> list[TensorInfo]:
        self._check_count("header", count, 8 + 4 + 4 + 8, "tensors")  # name length, dims, type, offset
        out = []
        for _ in range(count):
            name = self._string().decode("utf-8", "replace")
            dims = self._take("I")
            if dims > 8:  # ggml has at most 4; more means a damaged header, not a bigger tensor
                raise ModelFileError(f"{self.name} declares a tensor with {dims} dimensions ({name}).")
            shape = tuple(self._take("Q") for _ in range(dims))
            ggml_type, _offset = self._take("IQ")
            out.append(TensorInfo(name, ggml_type, shape))
        return out


def metadata_problem(meta: dict[str, Any], name: str) -> str | None:
    """What in this metadata would make llama.cpp abort (GGML_ASSERT) rather than refuse; None if nothing.

    These mirror llama.cpp's asserts in load_hparams and the vocabulary loader, so the reason can be
    named in words; the child-process check (model_check.py) catches whatever they miss."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, bytes) or not arch:
        return f"{name} does not say which architecture it is (general.architecture is missing)."
    arch = arch.decode("utf-8", "replace")

    def number(key: str) -> float | None:
        value = meta.get(f"{arch}.{key}")
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    layers = number("block_count")
    if layers is not None and not 0 < layers <= MAX_LAYERS:
        return f"{name} claims {layers} layers (llama.cpp supports 1 to {MAX_LAYERS}): its header is damaged."
    experts, used = number("expert_count"), number("expert_used_count")
    if experts is not None and experts > MAX_EXPERTS:
        return f"{name} claims {experts} experts (llama.cpp supports at most {MAX_EXPERTS}): its header is damaged."
    if used is not None and experts is not None and used > experts:
        return f"{name} uses {used} of {experts} experts per token: its header is damaged."
    nextn = number("nextn_predict_layers")
    if nextn is not None and layers is not None and nextn > layers:
        return f"{name} claims {nextn} prediction layers beyond its {layers} layers: its header is damaged."
    rope = meta.get(f"{arch}.rope.scaling.type")
    rope = rope.decode("utf-8", "replace") if isinstance(rope, bytes) else rope
    if rope is not None and rope not in ROPE_SCALING_TYPES:
        return f"{name} asks for an unknown RoPE scaling type {rope!r} (known: {', '.join(ROPE_SCALING_TYPES)})."
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and not all(isinstance(token, bytes) for token in tokens):
        # llama.cpp reads the vocabulary with gguf_get_arr_str, which asserts the array holds strings
        return f"{name}'s vocabulary (tokenizer.ggml.tokens) is not a list of strings: the file is damaged."
    if isinstance(tokens, list):
        seen: dict[bytes, int] = {}
        for i, token in enumerate(tokens):
            if not token:
                continue  # llama.cpp renames empty tokens [EMPTY_i]: several of them are fine
            first = seen.setdefault(token, i)
            if first != i:
                return (
                    f"{name} has the token {token.decode('utf-8', 'replace')!r} twice in its vocabulary "
                    f"(ids {first} and {i}): the file is damaged."
                )
    return None
