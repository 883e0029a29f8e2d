"""Can this draft's tokens be verified by this target? llama.cpp's rules (common/speculative.cpp):
same vocabulary type, same BOS/EOS handling, sizes within 128, identical token text from id 5 up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import llama_cpp as L

from ..errors import VocabMismatchError

MAX_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5


@dataclass(frozen=True)
class Compatibility:
    ok: bool
    reason: str = ""


class _Vocabulary(Protocol):
    """What of a loaded model (engine.decoding.runtime.Model) the check reads."""

    @property
    def vocab(self) -> Any: ...  # llama.cpp's llama_vocab pointer
    @property
    def n_vocab(self) -> int: ...
    @property
    def path(self) -> Path: ...


def check_compatible(target: _Vocabulary, draft: _Vocabulary) -> Compatibility:
    """Compare two loaded models (Model objects; vocab_only loads suffice)."""
    tv, dv = target.vocab, draft.vocab
    if L.llama_vocab_type(tv) != L.llama_vocab_type(dv):
        return Compatibility(False, "different vocabulary types (e.g. SentencePiece vs BPE)")
    if (L.llama_vocab_get_add_bos(tv), L.llama_vocab_bos(tv)) != (L.llama_vocab_get_add_bos(dv), L.llama_vocab_bos(dv)):
        return Compatibility(False, f"different BOS tokens ({L.llama_vocab_bos(tv)} vs {L.llama_vocab_bos(dv)})")
    if (L.llama_vocab_get_add_eos(tv), L.llama_vocab_eos(tv)) != (L.llama_vocab_get_add_eos(dv), L.llama_vocab_eos(dv)):
        return Compatibility(False, f"different EOS tokens ({L.llama_vocab_eos(tv)} vs {L.llama_vocab_eos(dv)})")
    diff = abs(target.n_vocab - draft.n_vocab)
    if diff > MAX_SIZE_DIFFERENCE:
        return Compatibility(
            False,
            f"vocabulary sizes differ by {diff} ({target.n_vocab} vs {draft.n_vocab}; at most {MAX_SIZE_DIFFERENCE})",
        )
    for i in range(FIRST_CHECKED_TOKEN, min(target.n_vocab, draft.n_vocab)):
        a, b = L.llama_vocab_get_text(tv, i), L.llama_vocab_get_text(dv, i)
        if a != b:
            return Compatibility(False, f"token {i} differs: {a!r} vs {b!r}")
    return Compatibility(True)


def require_compatible(target: _Vocabulary, draft: _Vocabulary) -> None:
    result = check_compatible(target, draft)
    if not result.ok:
        raise VocabMismatchError(
            f"The draft model {draft.path.name} cannot draft for {target.path.name}: {result.reason}."
        )
