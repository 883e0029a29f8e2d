"""Can this draft's tokens be verified by this target? vocab_check.py's rules, applied to GGUF header
metadata (read_gguf_metadata, or remote_gguf before a download) instead of models loaded by llama.cpp.

llama.cpp's vocabulary loader (src/llama-vocab.cpp, llama_vocab::impl::load) fills in what a header
leaves out; the same defaults are applied here, so both checks give the same answer:
- the vocabulary type, BOS/EOS ids and add_bos/add_eos per tokenizer.ggml.model;
- BPE pre-tokenizers (tokenizer.ggml.pre) that add BOS or have none;
- a default id beyond the vocabulary means "none"; a key's id beyond it is ignored;
- tokenizer.ggml.add_bos_token / add_eos_token override; Gemma 4's pre-tokenizer always adds BOS;
- an empty token reads as "[EMPTY_<id>]", and a token's text ends at a NUL byte (a C string).
"""

from __future__ import annotations

from typing import Any

from .vocab_check import FIRST_CHECKED_TOKEN, MAX_SIZE_DIFFERENCE, Compatibility

_NONE = -1  # LLAMA_TOKEN_NULL

# tokenizer.ggml.model -> (vocabulary type, BOS id, EOS id, add_bos, add_eos) before any key is read
_MODELS = {
    "no_vocab": ("none", _NONE, _NONE, False, False),
    "none": ("none", _NONE, _NONE, False, False),
    "llama": ("SPM", 1, 2, True, False),
    "bert": ("WPM", 101, _NONE, True, False),
    "gpt2": ("BPE", 11, 11, False, False),
    "hybriddna": ("BPE", 11, 11, False, False),
    "whitespace": ("BPE", 11, 11, False, False),
    "gemma4": ("BPE", _NONE, _NONE, False, False),
    "t5": ("UGM", _NONE, 1, False, True),
    "rwkv": ("RWKV", _NONE, _NONE, False, False),
    "test": ("TEST", _NONE, _NONE, False, False),
    "plamo2": ("PLAMO2", 1, 2, False, False),
}
_BPE_ADDING_BOS = {
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "tekken",
    "chameleon",
}
_BPE_WITHOUT_BOS = {"chatglm-bpe", "glm4", "glm5"}
_GEMMA4_PRE = {"gemma4", "granite-embed-multi-311m"}  # llama.cpp forces add_bos for these


def check_compatible_metadata(target_meta: dict[str, Any], draft_meta: dict[str, Any]) -> Compatibility:
    """Compare two GGUF headers' vocabularies as vocab_check.check_compatible compares loaded models."""
    for role, meta in (("target", target_meta), ("draft", draft_meta)):
        problem = _unloadable(meta)
        if problem:
            return Compatibility(False, f"the {role} {problem}")
    t, d = _Vocab(target_meta), _Vocab(draft_meta)
    if t.type != d.type:
        return Compatibility(False, "different vocabulary types (e.g. SentencePiece vs BPE)")
    if (t.add_bos, t.bos) != (d.add_bos, d.bos):
        return Compatibility(False, f"different BOS tokens ({t.bos} vs {d.bos})")
    if (t.add_eos, t.eos) != (d.add_eos, d.eos):
        return Compatibility(False, f"different EOS tokens ({t.eos} vs {d.eos})")
    diff = abs(len(t.tokens) - len(d.tokens))
    if diff > MAX_SIZE_DIFFERENCE:
        return Compatibility(
            False,
            f"vocabulary sizes differ by {diff} ({len(t.tokens)} vs {len(d.tokens)}; at most {MAX_SIZE_DIFFERENCE})",
        )
    n = min(len(t.tokens), len(d.tokens))
    if t.tokens[FIRST_CHECKED_TOKEN:n] == d.tokens[FIRST_CHECKED_TOKEN:n]:
        return Compatibility(True)  # equal raw text is equal text: the common case, one comparison
    for i in range(FIRST_CHECKED_TOKEN, n):
        a, b = _text(t.tokens, i), _text(d.tokens, i)
        if a != b:
            return Compatibility(False, f"token {i} differs: {a!r} vs {b!r}")
    return Compatibility(True)


def _unloadable(meta: dict[str, Any]) -> str | None:
    """What would stop llama.cpp loading this vocabulary at all (so its check fails too); None if nothing."""
    model = _str(meta.get("tokenizer.ggml.model"))
    if model is None:
        return "has no tokenizer (tokenizer.ggml.model is missing)"
    if model not in _MODELS:
        return f"has a tokenizer llama.cpp does not know ({model!r})"
    if _MODELS[model][0] == "none":
        return None
    if not isinstance(meta.get("tokenizer.ggml.tokens"), list):
        return "has no vocabulary (tokenizer.ggml.tokens is missing)"
    pre = _str(meta.get("tokenizer.ggml.pre"))
    if (
        model in ("gpt2", "hybriddna", "whitespace", "gemma4")
        and pre != "kimi-k2"
        and "tokenizer.ggml.merges" not in meta
    ):
        return "has a BPE vocabulary without merges (tokenizer.ggml.merges), which llama.cpp needs"
    return None


class _Vocab:
    """What llama.cpp makes of a header's vocabulary keys: type, BOS/EOS ids, add_bos/add_eos, tokens."""

    def __init__(self, meta: dict[str, Any]):
        model = _str(meta["tokenizer.ggml.model"])
        assert model is not None  # _unloadable checked it first
        self.type, bos, eos, add_bos, add_eos = _MODELS[model]
        pre = "gemma4" if model == "gemma4" else _str(meta.get("tokenizer.ggml.pre")) or ""
        if self.type == "none":  # llama.cpp stops here: dummy tokens, no keys read
            arch = _str(meta.get("general.architecture")) or ""
            count = meta.get(f"{arch}.vocab_size")
            self.tokens = [b""] * (count if isinstance(count, int) else 0)
            self.bos, self.eos, self.add_bos, self.add_eos = bos, eos, add_bos, add_eos
            return
        if self.type == "BPE" and pre in _BPE_ADDING_BOS:
            add_bos = True
        if self.type == "BPE" and pre in _BPE_WITHOUT_BOS:
            bos = _NONE
        self.tokens = meta["tokenizer.ggml.tokens"]
        self.bos = self._special(meta, "tokenizer.ggml.bos_token_id", bos)
        self.eos = self._special(meta, "tokenizer.ggml.eos_token_id", eos)
        gemma4 = self.type == "BPE" and pre in _GEMMA4_PRE
        self.add_bos = _flag(meta, "tokenizer.ggml.add_bos_token", add_bos) or gemma4
        self.add_eos = _flag(meta, "tokenizer.ggml.add_eos_token", add_eos)

    def _special(self, meta: dict[str, Any], key: str, default: int) -> int:
        if default >= len(self.tokens):
            default = _NONE  # "default special token out of vocab range, disabling"
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(self.tokens):
            return value
        return default  # absent, or "bad special token ... using default id"


def _flag(meta: dict[str, Any], key: str, default: bool) -> bool:
    value = meta.get(key)
    return bool(value) if isinstance(value, (bool, int)) else default


def _text(tokens: list[bytes], i: int) -> bytes:
    """A token's text as llama_vocab_get_text gives it."""
    token = tokens[i]
    if not token:
        return f"[EMPTY_{i}]".encode()
    return token.split(b"\0", 1)[0]


def _str(value: object) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else None
