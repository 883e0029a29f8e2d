"""The header check (header_vocab.check_compatible_metadata, before any download) gives the same answer
as llama.cpp's own (pair_check.check_pair, vocabularies loaded): real models of three vocabulary
families, and tiny GGUFs whose vocabularies differ in each way the rules look at."""

from pathlib import Path

import pytest

from engine.decoding.pair_check import check_drafts
from engine.modelfiles.embedded import embedded_gemma_path, embedded_model_path
from engine.modelfiles.gguf_header import read_gguf_metadata
from engine.modelfiles.header_vocab import check_compatible_metadata

from support.tiny import default_tokens, write_tiny_gguf

pytestmark = pytest.mark.slow  # every ordered pair of vocabularies loaded by llama.cpp

PAIRS = Path("/root/.cache/SpecChat/pairs")
QWEN = {
    "qwen-1.5b": PAIRS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "qwen-0.5b": PAIRS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}  # absent in CI: left out there
BPE_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "Ċ", "Ġ"] + [f"Ġw{i}" for i in range(200)]


def write_vocab_gguf(
    path: Path,
    model: str = "llama",
    tokens: list[str] | None = None,
    pre: str | None = None,
    bos: int | None = 1,
    eos: int | None = 2,
    add_bos: bool | None = None,
) -> Path:
    """A vocab-only loadable GGUF like write_tiny_gguf's, with the keys it always writes made optional."""
    import gguf
    import numpy as np

    tokens = tokens or default_tokens()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    for add, value in (
        (writer.add_context_length, 64),
        (writer.add_embedding_length, 8),
        (writer.add_block_count, 1),
        (writer.add_feed_forward_length, 16),
        (writer.add_head_count, 2),
        (writer.add_head_count_kv, 2),
    ):
        add(value)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    if model == "gpt2":
        writer.add_token_merges(["Ġ w"])
    else:
        writer.add_token_scores([0.0] * len(tokens))
    if bos is not None:
        writer.add_bos_token_id(bos)
    if eos is not None:
        writer.add_eos_token_id(eos)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vocabs")
    base = default_tokens()

    def changed(i: int, text: str) -> list[str]:
        return base[:i] + [text] + base[i + 1 :]

    found = {"smollm2": embedded_model_path(), "gemma3": embedded_gemma_path()}
    found.update({name: path for name, path in QWEN.items() if path.is_file()})
    tiny = {
        "tiny": lambda p: write_tiny_gguf(p),
        "tiny-other-weights": lambda p: write_tiny_gguf(p, payload_bytes=4096, seed=3),
        "tiny-token3": lambda p: write_tiny_gguf(p, tokens=changed(3, "\u2581other")),  # below id 5: not compared
        "tiny-token7": lambda p: write_tiny_gguf(p, tokens=changed(7, "\u2581other")),
        "tiny-empty9": lambda p: write_tiny_gguf(p, tokens=changed(9, "")),
        "tiny-named-empty9": lambda p: write_tiny_gguf(p, tokens=changed(9, "[EMPTY_9]")),  # how llama.cpp names it
        "tiny-plus100": lambda p: write_tiny_gguf(p, tokens=base + [f"\u2581x{i}" for i in range(100)]),
        "tiny-plus200": lambda p: write_tiny_gguf(p, tokens=base + [f"\u2581x{i}" for i in range(200)]),
        "tiny-no-special-keys": lambda p: write_vocab_gguf(p, bos=None, eos=None),  # SPM defaults: 1 and 2
        "tiny-eos3": lambda p: write_vocab_gguf(p, eos=3),
        "tiny-no-add-bos": lambda p: write_vocab_gguf(p, add_bos=False),
        "tiny-bos-past-end": lambda p: write_vocab_gguf(p, bos=5000),  # ignored: the default 1 stays
        "bpe-llama3": lambda p: write_vocab_gguf(p, "gpt2", BPE_TOKENS, pre="llama-bpe", bos=1, eos=2),  # adds BOS
        "bpe-qwen2": lambda p: write_vocab_gguf(p, "gpt2", BPE_TOKENS, pre="qwen2", bos=1, eos=2),
        "bpe-qwen2-add-bos": lambda p: write_vocab_gguf(p, "gpt2", BPE_TOKENS, pre="qwen2", bos=1, eos=2, add_bos=True),
        "bpe-default-ids": lambda p: write_vocab_gguf(p, "gpt2", BPE_TOKENS, pre="qwen2", bos=None, eos=None),
        "bpe-ids-11": lambda p: write_vocab_gguf(p, "gpt2", BPE_TOKENS, pre="qwen2", bos=11, eos=11),
        "spm-like-bpe": lambda p: write_vocab_gguf(p, "llama", BPE_TOKENS, bos=1, eos=2, add_bos=False),
    }
    for name, write in tiny.items():
        found[name] = write(folder / f"{name}.gguf")
    return found


def test_the_header_check_agrees_with_llama_cpp_on_every_ordered_pair(models):
    metas = {name: read_gguf_metadata(path) for name, path in models.items()}
    disagreements, agreed_ok = [], set()
    for target, target_path in models.items():
        loaded = check_drafts(target_path, [p for name, p in models.items() if name != target])
        for draft, draft_path in models.items():
            if draft == target:
                continue
            header = check_compatible_metadata(metas[target], metas[draft])
            llama = loaded[Path(draft_path)]
            if header != llama:  # ok and the reason, word for word
                disagreements.append(f"{target} <- {draft}: header {header}, llama.cpp {llama}")
            elif header.ok:
                agreed_ok.add((target, draft))
    print(f"{len(models) * (len(models) - 1)} ordered pairs, {len(agreed_ok)} compatible")
    assert not disagreements, "\n".join(disagreements)
    # Both checks could agree by refusing everything: these pairs must pass.
    must_pass = {
        ("tiny", "tiny-other-weights"),
        ("tiny", "tiny-token3"),
        ("tiny", "tiny-plus100"),
        ("tiny-plus100", "tiny"),
        ("tiny-empty9", "tiny-named-empty9"),
        ("tiny", "tiny-no-special-keys"),
        ("tiny", "tiny-bos-past-end"),
        ("bpe-llama3", "bpe-qwen2-add-bos"),
        ("bpe-default-ids", "bpe-ids-11"),
    }
    if all(name in models for name in QWEN):
        must_pass |= {("qwen-1.5b", "qwen-0.5b"), ("qwen-0.5b", "qwen-1.5b")}
    assert must_pass <= agreed_ok, must_pass - agreed_ok
    must_fail = {
        ("smollm2", "gemma3"),
        ("tiny", "tiny-token7"),
        ("tiny", "tiny-plus200"),
        ("tiny", "tiny-eos3"),
        ("tiny", "tiny-no-add-bos"),
        ("bpe-llama3", "bpe-qwen2"),
        ("tiny", "tiny-empty9"),
        ("spm-like-bpe", "bpe-qwen2"),
    }
    assert not must_fail & agreed_ok, must_fail & agreed_ok


def test_reasons_name_what_differs():
    base = {"tokenizer.ggml.model": b"llama", "tokenizer.ggml.tokens": [f"t{i}".encode() for i in range(300)]}
    assert check_compatible_metadata(base, dict(base)).ok
    bpe = {**base, "tokenizer.ggml.model": b"gpt2", "tokenizer.ggml.pre": b"qwen2", "tokenizer.ggml.merges": 0}
    assert check_compatible_metadata(base, bpe).reason == "different vocabulary types (e.g. SentencePiece vs BPE)"
    assert (
        check_compatible_metadata(base, {**base, "tokenizer.ggml.eos_token_id": 7}).reason
        == "different EOS tokens (2 vs 7)"
    )
    longer = {**base, "tokenizer.ggml.tokens": base["tokenizer.ggml.tokens"] + [b"x"] * 129}
    assert check_compatible_metadata(base, longer).reason == "vocabulary sizes differ by 129 (300 vs 429; at most 128)"
    assert "tokenizer.ggml.model is missing" in check_compatible_metadata(base, {}).reason
    assert (
        "merges"
        in check_compatible_metadata(bpe, {k: v for k, v in bpe.items() if k != "tokenizer.ggml.merges"}).reason
    )
