"""How the Models dialog names a model: a built-in one by its display name; any other by the name it was added
with (an Ollama model's name:tag) or else its file's name, with its quantization (from the file name, else the
header's general.file_type). Never the GGUF's internal general.name: a q4_k_m file can call itself
"Qwen2.5 Coder 0.5B Instruct AWQ"."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.modelfiles import model_store
from engine.modelfiles.embedded import DISPLAY_NAMES
from engine.modelfiles.header_peek import quantization
from engine.text_rules import plain_name

NO_QUANT = "quantization n/a"  # neither the file's name nor its header says


def model_label(spec: str, installed: Sequence[model_store.InstalledModel] = ()) -> str:
    """spec: a built-in model's id or a file path; installed: the list it may be in (for its display name)."""
    if spec in DISPLAY_NAMES:
        return DISPLAY_NAMES[spec]
    model = next((m for m in installed if str(m.path) == spec), None)
    name = model.name if model is not None else (model_store.display_name(spec) or Path(spec).name)
    return f"{plain_name(name)} · {quantization(spec) or NO_QUANT}"  # a file's name: no bidi control obeyed
