"""Does an EAGLE-3 or DFlash draft head fit a target? Read from both GGUF headers, before anything is downloaded.

A head is fed the hidden states of some of its target's layers (`<arch>.target_layers`), so llama.cpp needs
(common/speculative.cpp, src/models/eagle3.cpp and dflash.cpp):
- every layer it reads to exist in the target: an id past the target's block count aborts the process (GGML_ABORT);
- the target's hidden size to be the one the head was trained on (`<arch>.target_hidden_size`; a DFlash head
  without that key reads features of its own width, `<arch>.embedding_length`);
- the target's vocabulary: the head predicts the target's tokens (its reduced vocabulary maps into them, d2t).
A header that leaves out the hidden size or the vocabulary is not refused for it: llama.cpp checks those at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .header_vocab import check_compatible_metadata
from .model_inspect import HEAD_ARCHS, drafter_of

HEAD_NAMES = {"eagle3": "EAGLE-3", "dflash": "DFlash"}  # a head architecture as people name it


@dataclass(frozen=True)
class HeadFit:
    fits: bool
    reason: str  # why not, or what it is


def head_kind(meta: dict[str, Any]) -> str | None:
    """ "eagle3" or "dflash" for a draft head's header, else None."""
    arch = _text(meta.get("general.architecture"))
    return arch if arch in HEAD_ARCHS else None


def target_layers(meta: dict[str, Any]) -> list[int]:
    """The target layers a head's header says it reads; [] where missing or not a short list of whole numbers."""
    drafter = drafter_of(meta, []) if head_kind(meta) else None
    return list(drafter["target_layers"]) if drafter else []


def check_head(target_meta: dict[str, Any], head_meta: dict[str, Any]) -> HeadFit:
    """Whether the head whose header is head_meta can draft for the target whose header is target_meta."""
    kind = head_kind(head_meta)
    if kind is None:
        return HeadFit(False, "not a draft head")
    name = HEAD_NAMES.get(kind, kind)
    layers = target_layers(head_meta)
    if not layers:
        return HeadFit(False, f"the {name} head does not say which of its target's layers it reads")
    arch = _text(target_meta.get("general.architecture"))
    blocks = _int(target_meta, f"{arch}.block_count")
    if blocks is not None and (min(layers) < 0 or max(layers) > blocks):
        return HeadFit(False, f"it reads layer {max(layers)}; the target has {blocks} layers")
    wanted = _int(head_meta, f"{kind}.target_hidden_size")
    if wanted is None and kind == "dflash":
        wanted = _int(head_meta, f"{kind}.embedding_length")
    hidden = _int(target_meta, f"{arch}.embedding_length")
    if wanted is not None and hidden is not None and wanted != hidden:
        return HeadFit(False, f"it was made for a target of hidden size {wanted}; this target's is {hidden}")
    vocab = _vocabulary(head_meta, target_meta)
    if vocab:
        return HeadFit(False, vocab)
    return HeadFit(True, f"{name} head for this target (reads its layers {', '.join(map(str, layers))})")


def _vocabulary(head_meta: dict[str, Any], target_meta: dict[str, Any]) -> str:
    """Why the head's vocabulary does not fit the target's, or "" (fits, or the head's header does not say)."""
    tokens = head_meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and isinstance(target_meta.get("tokenizer.ggml.tokens"), list):
        result = check_compatible_metadata(target_meta, head_meta)  # both token lists: llama.cpp's full rules
        return "" if result.ok else result.reason
    head_size, target_size = _vocab_size(head_meta), _vocab_size(target_meta)
    if head_size is not None and target_size is not None and head_size != target_size:
        return f"it was made for a vocabulary of {head_size:,} tokens; the target's has {target_size:,}"
    return ""


def _vocab_size(meta: dict[str, Any]) -> int | None:
    tokens = meta.get("tokenizer.ggml.tokens")  # a list, or its count where the strings were stepped over
    if isinstance(tokens, list):
        return len(tokens)
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        return tokens
    return _int(meta, f"{_text(meta.get('general.architecture'))}.vocab_size")


def _int(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return value if _is_int(value) else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""
