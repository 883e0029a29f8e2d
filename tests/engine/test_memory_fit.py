"""Memory estimates from the embedded models' real GGUF headers (SmolLM2 135M, Gemma 3 270M)."""

import pytest

from engine.errors import InvalidSettingError
from engine.modelfiles.embedded import embedded_gemma_path, embedded_model_path
from engine.modelfiles.gguf_header import read_gguf_metadata
from engine.modelfiles.memory_fit import GIB, MIB, RAM_MARGIN_BYTES, VRAM_MARGIN_BYTES, estimate_fit, kv_cache_bytes

PLENTY = 64 * GIB


@pytest.fixture(scope="module")
def smol():
    path = embedded_model_path()
    return read_gguf_metadata(path), path.stat().st_size


@pytest.fixture(scope="module")
def gemma():
    path = embedded_gemma_path()
    return read_gguf_metadata(path), path.stat().st_size


def test_smollm2_kv_cache_from_its_header(smol):
    meta, _ = smol
    # 30 layers, 576 wide, 9 query heads (so 64 per head), 3 KV heads; no key_length in the header.
    assert (meta["llama.block_count"], meta["llama.embedding_length"]) == (30, 576)
    assert (meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]) == (9, 3)
    assert "llama.attention.key_length" not in meta
    assert kv_cache_bytes(meta, 4096) == 30 * 3 * (64 + 64) * 2 * 4096 == 94_371_840
    assert kv_cache_bytes(meta, 1) == 23_040


def test_gemma_kv_cache_uses_its_key_and_value_lengths(gemma):
    meta, _ = gemma
    # 18 layers, 1 KV head of 256 (wider than 640 / 4 heads = 160: the header's lengths win).
    assert (meta["gemma3.block_count"], meta["gemma3.attention.head_count_kv"]) == (18, 1)
    assert (meta["gemma3.attention.key_length"], meta["gemma3.attention.value_length"]) == (256, 256)
    assert kv_cache_bytes(meta, 8192) == 18 * 1 * (256 + 256) * 2 * 8192 == 150_994_944


def test_per_layer_kv_heads_count_only_the_layers_that_have_them(smol):
    meta, _ = smol
    hybrid = {**meta, "llama.attention.head_count_kv": [3] * 10 + [0] * 20}  # 20 layers without attention
    assert kv_cache_bytes(hybrid, 4096) == kv_cache_bytes(meta, 4096) // 3


@pytest.mark.parametrize(
    "drop", ["llama.block_count", "llama.attention.head_count", "general.architecture", "llama.embedding_length"]
)
def test_a_header_without_the_counts_gives_no_kv_figure(smol, drop):
    meta, size = smol
    partial = {k: v for k, v in meta.items() if k != drop}
    assert kv_cache_bytes(partial, 4096) is None
    fit = estimate_fit(partial, size, 4096, free_ram=PLENTY)
    assert fit.kv_bytes is None and fit.total_bytes == size and "without the KV cache" in fit.text


def test_without_a_gpu_it_fits_in_ram_or_is_too_large(smol):
    meta, size = smol
    kv = kv_cache_bytes(meta, 4096)
    fit = estimate_fit(meta, size, 4096, draft_bytes=10 * MIB, free_ram=PLENTY)
    assert (fit.weights_bytes, fit.kv_bytes, fit.draft_bytes) == (size, kv, 10 * MIB)
    assert fit.total_bytes == size + kv + 10 * MIB
    assert (fit.verdict, fit.layers_on_gpu) == ("fits in RAM", None)
    assert fit.text == "≈194 MiB at 4096 tokens: fits in RAM (estimate)"
    exact = fit.total_bytes + RAM_MARGIN_BYTES
    assert estimate_fit(meta, size, 4096, draft_bytes=10 * MIB, free_ram=exact).verdict == "fits in RAM"
    assert estimate_fit(meta, size, 4096, draft_bytes=10 * MIB, free_ram=exact - 1).verdict == "too large"


def test_free_ram_defaults_to_what_is_available_now(smol, monkeypatch):
    import psutil

    class Memory:
        available = 100 * MIB  # less than the model needs

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory)
    meta, size = smol
    assert estimate_fit(meta, size, 4096).verdict == "too large"


def test_vram_verdicts_layer_by_layer(gemma):
    meta, size = gemma
    model = size + kv_cache_bytes(meta, 4096)
    per_layer = model / 18
    on_card = estimate_fit(meta, size, 4096, free_vram=VRAM_MARGIN_BYTES + model, free_ram=PLENTY)
    assert (on_card.verdict, on_card.layers_on_gpu) == ("fits in VRAM", 18)
    part = estimate_fit(meta, size, 4096, free_vram=VRAM_MARGIN_BYTES + int(per_layer * 12.5), free_ram=PLENTY)
    assert (part.verdict, part.layers_on_gpu) == ("partly offloaded (12/18 layers)", 12)
    assert part.text.startswith("≈313 MiB at 4096 tokens: partly offloaded (12/18 layers)")
    none = estimate_fit(meta, size, 4096, free_vram=VRAM_MARGIN_BYTES // 2, free_ram=PLENTY)
    assert (none.verdict, none.layers_on_gpu) == ("fits in RAM", 0)
    # The six layers left for RAM need more than RAM has to spare.
    short = estimate_fit(
        meta,
        size,
        4096,
        free_vram=VRAM_MARGIN_BYTES + int(per_layer * 12.5),
        free_ram=RAM_MARGIN_BYTES + int(per_layer * 5),
    )
    assert (short.verdict, short.layers_on_gpu) == ("too large", 12)


def test_the_draft_takes_its_place_on_the_card_first(gemma):
    meta, size = gemma
    model = size + kv_cache_bytes(meta, 4096)
    per_layer = model / 18
    draft = int(per_layer * 2)
    fit = estimate_fit(meta, size, 4096, draft_bytes=draft, free_vram=VRAM_MARGIN_BYTES + model, free_ram=PLENTY)
    assert (fit.verdict, fit.layers_on_gpu) == ("partly offloaded (16/18 layers)", 16)
    # A draft larger than the card leaves it for RAM; the target's layers still go to the card.
    huge = estimate_fit(meta, size, 4096, draft_bytes=PLENTY // 2, free_vram=VRAM_MARGIN_BYTES + model, free_ram=PLENTY)
    assert (huge.verdict, huge.layers_on_gpu) == ("fits in VRAM (draft in RAM)", 18)


def test_a_longer_context_costs_more_and_a_context_must_hold_a_token(smol):
    meta, size = smol
    short, long = (estimate_fit(meta, size, n, free_ram=PLENTY) for n in (2048, 8192))
    assert long.total_bytes - short.total_bytes == kv_cache_bytes(meta, 6144)
    assert long.text == "≈274 MiB at 8192 tokens: fits in RAM (estimate)"  # 98 362 432 + 23 040 × 8192 bytes
    huge = estimate_fit(meta, size, 65536, free_ram=PLENTY)  # 98 362 432 + 23 040 × 65 536 bytes
    assert huge.text == "≈1.5 GiB at 65536 tokens: fits in RAM (estimate)"
    with pytest.raises(InvalidSettingError):
        estimate_fit(meta, size, 0)
