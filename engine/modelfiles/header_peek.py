"""What a local GGUF header says without its vocabulary's strings (about 0.1 s for Gemma's 262k tokens, against
~1.5 s to load that vocabulary in llama.cpp): its quantization, and its tokenizer's vocabulary type. Cached per
file version. For the Models dialog: naming a model by its file and quantization, and ruling out a draft whose
vocabulary type differs from the target's without loading either vocabulary."""

from __future__ import annotations

import mmap
import threading
from pathlib import Path
from typing import Any

from ..errors import ModelFileError
from .gguf_header import open_model, parse_gguf, read_gguf_header
from .header_vocab import _MODELS  # llama.cpp's vocabulary type per tokenizer.ggml.model
from .hub_search import quantization_of

# llama.cpp's llama_ftype (include/llama.h), as general.file_type stores it: "MOSTLY_" left off.
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
}

_cache: dict[tuple[str, int, int], dict[str, Any]] = {}
_lock = threading.Lock()


def quantization(path: str | Path) -> str | None:
    """The quantization its file name states (hub_search's rule), else its header's general.file_type; None where
    neither says (an Ollama blob of an unknown type, a file that cannot be read)."""
    named = quantization_of(str(path))
    if named != "unknown":
        return named
    file_type = _meta(Path(path)).get("general.file_type")
    return FILE_TYPES.get(file_type) if isinstance(file_type, int) else None


def vocab_type(path: str | Path) -> str | None:
    """llama.cpp's vocabulary type ("SPM", "BPE", ...) by the header's tokenizer.ggml.model; None if unknown."""
    model = _meta(Path(path)).get("tokenizer.ggml.model")
    if isinstance(model, bytes):
        model = model.decode("utf-8", "replace")
    return _MODELS[model][0] if model in _MODELS else None


def _meta(path: Path) -> dict[str, Any]:
    try:
        stat = path.stat()
    except OSError:
        return {}
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _lock:
        if key in _cache:
            return _cache[key]
    try:
        read_gguf_header(path)  # its own checks of a short or foreign file first
        with open_model(path) as (f, _), mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            meta = parse_gguf(_Mapped(data), path.name, tensors=True)[0]  # tensors=True: strings stepped over
    except (ModelFileError, OSError, ValueError):
        meta = {}  # unreadable: said as "n/a" where shown; the model check says why when it is used
    with _lock:
        _cache[key] = meta
    return meta


class _Mapped:
    """The whole mapping at the first read, as gguf_header's own mapped source hands it."""

    def __init__(self, data: mmap.mmap):
        self._data, self.size = data, len(data)

    def read(self, at: int, n: int) -> bytes | mmap.mmap:
        return self._data if at == 0 else self._data[at : at + n]
