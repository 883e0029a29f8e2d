"""What a GGUF file's header says about the model (`python -m engine.models inspect FILE`): its architecture,
vocabulary, context and layers, and its drafter, all read from the header and tensor list without loading a weight.

The drafter is what llama.cpp (pinned in llama-cpp-python 0.3.36) can draft with:
- {"kind": "mtp", "layers": N}: multi-token-prediction ("nextn") layers inside the model's own file. Their tensors
  are `blk.{i}.nextn.eh_proj.weight` on the last N blocks (`<arch>.block_count` counts them;
  `<arch>.nextn_predict_layers` says N). llama-server looks for `blk.{block_count-1}.nextn.eh_proj.weight`: a file
  whose key claims layers its converter left out has no drafter.
- {"kind": "eagle3" | "dflash", "target_layers": [...]}: the file *is* a draft head of that architecture, fed the
  inputs of those layers of its target.
- None: neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import EngineError
from .gguf_header import MAX_LAYERS, TensorInfo, read_gguf_layout
from .header_peek import FILE_TYPES
from .header_vocab import _MODELS  # llama.cpp's vocabulary type per tokenizer.ggml.model

HEAD_ARCHS = ("eagle3", "dflash")  # draft-head architectures (src/models/eagle3.cpp, dflash.cpp)
MAX_TARGET_LAYERS = 64  # EAGLE-3 takes 3, DFlash a handful: more is a damaged header
# Head kind -> None where SpecChat drafts with such a file given as the draft, else the one sentence that says why
# not (the Models window and the pair check show it).
HEAD_SUPPORT: dict[str, str | None] = {
    "eagle3": None,  # proposers/eagle3.py
    "dflash": "SpecChat does not draft with DFlash heads yet (their block drafting is not built in): "
    "use an EAGLE-3 head or a draft model.",
}


def inspect_model(path: str | Path) -> dict[str, Any]:
    """The header's facts about the model at path (ModelFileError if it is not a readable GGUF)."""
    meta, tensors = read_gguf_layout(path)
    arch = _text(meta.get("general.architecture")) or None
    model = _text(meta.get("tokenizer.ggml.model"))
    tokens = meta.get("tokenizer.ggml.tokens")  # stepped over: its count
    return {
        "path": str(Path(path)),
        "name": _text(meta.get("general.name")) or None,
        "architecture": arch,
        "file_type": FILE_TYPES.get(meta["general.file_type"]) if _is_int(meta.get("general.file_type")) else None,
        "vocabulary": {
            "model": model or None,
            "type": _MODELS[model][0] if model in _MODELS else None,
            "size": len(tokens) if isinstance(tokens, list) else tokens if _is_int(tokens) else None,
        },
        "context": _int_key(meta, f"{arch}.context_length"),
        "layers": _int_key(meta, f"{arch}.block_count"),
        "embedding": _int_key(meta, f"{arch}.embedding_length"),
        "tensors": len(tensors),
        "drafter": drafter_of(meta, tensors),
    }


def has_mtp_layers(path: str | Path) -> bool:
    """Whether the file carries MTP layers llama.cpp can draft with (False for a file whose header cannot be read:
    loading it says why)."""
    try:
        drafter = inspect_model(path)["drafter"]
    except EngineError:
        return False
    return bool(drafter) and drafter.get("kind") == "mtp"


def drafter_of(meta: dict[str, Any], tensors: list[TensorInfo]) -> dict[str, Any] | None:
    """The built-in drafter a header describes (see the module's note), or None."""
    arch = _text(meta.get("general.architecture"))
    if arch in HEAD_ARCHS:
        layers = meta.get(f"{arch}.target_layers")
        if not isinstance(layers, list) or len(layers) > MAX_TARGET_LAYERS or not all(map(_is_int, layers)):
            layers = []  # a head that does not say which layers it reads: llama.cpp refuses it at load
        return {"kind": arch, "target_layers": list(layers)}
    names = {t.name for t in tensors}
    blocks = _int_key(meta, f"{arch}.block_count")
    with_head = [i for i in range(min(blocks or 0, MAX_LAYERS)) if f"blk.{i}.nextn.eh_proj.weight" in names]
    if not with_head or blocks is None or blocks - 1 not in with_head:
        return None
    claimed = _int_key(meta, f"{arch}.nextn_predict_layers")
    return {"kind": "mtp", "layers": claimed if claimed and claimed <= blocks else len(with_head)}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_key(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""
