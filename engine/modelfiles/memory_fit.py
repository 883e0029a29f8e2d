"""Will a model fit? An estimate from its GGUF header and file size, before anything is loaded.

The rule, kept small on purpose:
- weights take the file's size (GGUF stores the tensors as they are loaded);
- the KV cache holds an f16 K and V row for every token of the context in every layer (sliding-window
  layers, which llama.cpp may keep shorter, are counted in full: the estimate errs high);
- with a GPU, the draft model goes to the card first (small, and drafting waits on it), then the
  target's layers, each an equal share of weights + KV cache, as many as fit under the free VRAM less
  VRAM_MARGIN_BYTES; the rest runs from RAM, which must hold it with RAM_MARGIN_BYTES to spare.
Compute buffers and the runtime's own memory are what the margins stand for; nothing here is measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psutil

from ..errors import InvalidSettingError

GIB = 1024**3
MIB = 1024**2
F16_BYTES = 2
# A card's free memory also holds the CUDA/Vulkan context and llama.cpp's compute buffers.
VRAM_MARGIN_BYTES = 512 * MIB
# RAM also holds the app, the compute buffers on the CPU side and the token tables.
RAM_MARGIN_BYTES = 256 * MIB


@dataclass(frozen=True)
class MemoryFit:
    weights_bytes: int
    kv_bytes: int | None  # None: the header does not say enough to compute it (counted as 0)
    draft_bytes: int
    total_bytes: int
    verdict: str  # "fits in VRAM", "partly offloaded (20/28 layers)", "fits in RAM" or "too large"
    # (and "fits in VRAM (draft in RAM)" for a draft bigger than the card's room)
    layers_on_gpu: int | None  # None without a GPU
    text: str  # for people: "≈1.4 GiB at 4096 tokens: fits in RAM (estimate)"


def kv_cache_bytes(meta: dict[str, Any], n_ctx: int) -> int | None:
    """Bytes of an f16 KV cache for n_ctx tokens, or None when the header lacks the counts."""
    shape = _attention_shape(meta)
    if shape is None:
        return None
    per_token = sum(kv_heads * (key_len + value_len) for kv_heads, key_len, value_len in shape)
    return per_token * F16_BYTES * n_ctx


def estimate_fit(
    meta: dict[str, Any],
    file_size: int,
    n_ctx: int,
    *,
    draft_bytes: int = 0,
    free_ram: int | None = None,
    free_vram: int | None = None,
) -> MemoryFit:
    """Where a model of this header and size would run with n_ctx tokens of context.
    free_ram defaults to the memory available now; free_vram None means a build without a GPU."""
    if n_ctx < 1:
        raise InvalidSettingError(f"The context must hold at least one token, not {n_ctx}.")
    kv = kv_cache_bytes(meta, n_ctx)
    model = file_size + (kv or 0)
    total = model + draft_bytes
    ram_budget = (psutil.virtual_memory().available if free_ram is None else free_ram) - RAM_MARGIN_BYTES
    layers = None
    if free_vram is None:
        verdict = "fits in RAM" if total <= ram_budget else "too large"
    else:
        n_layers = _int(meta, "block_count") or 1  # no layer count: the model moves as one piece
        layers, in_ram = _gpu_split(model, draft_bytes, n_layers, free_vram)
        if in_ram == 0:
            verdict = "fits in VRAM"
        elif in_ram > ram_budget:
            verdict = "too large"
        elif layers == n_layers:  # only a draft too big for the card is left over
            verdict = "fits in VRAM (draft in RAM)"
        elif layers:
            verdict = f"partly offloaded ({layers}/{n_layers} layers)"
        else:
            verdict = "fits in RAM"
    unknown = "" if kv is not None else " without the KV cache, which the header does not describe,"
    text = f"≈{format_size(total)} at {n_ctx} tokens{unknown}: {verdict} (estimate)"
    return MemoryFit(
        weights_bytes=file_size,
        kv_bytes=kv,
        draft_bytes=draft_bytes,
        total_bytes=total,
        verdict=verdict,
        layers_on_gpu=layers,
        text=text,
    )


def format_size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _gpu_split(model: int, draft: int, n_layers: int, free_vram: int) -> tuple[int, int]:
    """(target layers on the card, bytes left for RAM), the draft placed first."""
    budget = free_vram - VRAM_MARGIN_BYTES
    draft_on_gpu = draft if draft <= budget else 0
    budget -= draft_on_gpu
    # floor(budget / (model / n_layers)) in whole numbers, so an exact fit is not lost to rounding.
    layers = n_layers if model == 0 else min(n_layers, max(0, budget * n_layers // model))
    in_ram = model - model * layers // n_layers + (draft - draft_on_gpu)
    return layers, in_ram


def _attention_shape(meta: dict[str, Any]) -> list[tuple[int, int, int]] | None:
    """(KV heads, key length, value length) of every layer, from the header's counts."""
    n_layers = _int(meta, "block_count")
    n_embd = _int(meta, "embedding_length")
    heads = _per_layer(_value(meta, "attention.head_count"), n_layers)
    kv_heads = _per_layer(_value(meta, "attention.head_count_kv"), n_layers) or heads  # absent: no GQA
    if not n_layers or not n_embd or heads is None or kv_heads is None:
        return None
    shape = []
    for layer_heads, layer_kv in zip(heads, kv_heads):
        # llama.cpp's default head size is embedding / heads; key_length and value_length override it.
        default = n_embd // layer_heads if layer_heads else 0
        shape.append(
            (layer_kv, _int(meta, "attention.key_length") or default, _int(meta, "attention.value_length") or default)
        )
    return shape


def _value(meta: dict[str, Any], key: str) -> Any:
    arch = meta.get("general.architecture")
    if isinstance(arch, bytes):
        arch = arch.decode("utf-8", "replace")
    return meta.get(f"{arch}.{key}") if arch else None


def _int(meta: dict[str, Any], key: str) -> int | None:
    value = _value(meta, key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _per_layer(value: object, n_layers: int | None) -> list[int] | None:
    """A count the header gives once for all layers, or as one number per layer (hybrid models)."""
    if not n_layers:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * n_layers
    if isinstance(value, (list, tuple)) and len(value) == n_layers and all(isinstance(v, int) for v in value):
        return list(value)
    return None
