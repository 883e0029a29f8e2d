"""The decoding methods, their words, defaults and limits: one registry that the engine, the app and the tools
read, so a label or a limit is said once. No imports from the rest of engine/: everything may import this.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    key: str  # as settings, the CLIs and the API spell it
    label: str  # the settings' choice ("Prompt lookup")
    name: str  # the stats line ("prompt lookup")
    prose: str  # the lab report's sentences ("the draft model")
    legend: str  # a chart's legend ("draft model")
    box: str  # the lab's check box ("auto (both)")
    colour: str  # its line in every chart
    needs_draft: bool = False  # loads a draft model
    needs_mtp: bool = False  # drafts with the target's own MTP (nextn) layers: the target is loaded with them


NONE = Method(
    "none", label="Off", name="no speculation", prose="plain decoding", legend="plain", box="plain", colour="#555555"
)
LOOKUP = Method(
    "lookup",
    label="Prompt lookup",
    name="prompt lookup",
    prose="prompt lookup",
    legend="lookup",
    box="lookup",
    colour="#1f77b4",
)
DRAFT = Method(
    "draft",
    label="Draft model",
    name="draft model",
    prose="the draft model",
    legend="draft model",
    box="draft model",
    colour="#d62728",
    needs_draft=True,
)
AUTO = Method(
    "auto",
    label="Lookup + draft model (auto)",
    name="lookup + draft model (auto)",
    prose="lookup and the draft model, chosen per step",
    legend="auto",
    box="auto (both)",
    colour="#2ca02c",
    needs_draft=True,
)
MTP = Method(
    "mtp",
    label="Built-in drafter (MTP)",
    name="built-in drafter (MTP)",
    prose="the model's own MTP head",
    legend="MTP head",
    box="MTP head",
    colour="#9467bd",
    needs_mtp=True,
)

REGISTRY = {m.key: m for m in (NONE, LOOKUP, DRAFT, AUTO, MTP)}
METHODS = tuple(REGISTRY)  # ("none", "lookup", "draft", "auto", "mtp")
DRAFT_METHODS = tuple(k for k, m in REGISTRY.items() if m.needs_draft)  # the methods that load a draft model
MTP_METHODS = tuple(k for k, m in REGISTRY.items() if m.needs_mtp)  # the methods that load the target's MTP layers
DEFAULT_METHOD = LOOKUP.key  # needs no second model, and pays wherever an answer repeats its prompt


def method_words(field: str) -> dict[str, str]:
    """key -> one of Method's words (label, name, prose, legend, box, colour), in METHODS' order."""
    return {key: getattr(m, field) for key, m in REGISTRY.items()}


# --- draft lengths ------------------------------------------------------------------------------
MAX_DRAFT_LIMIT = 64  # the most draft tokens any step verifies, whatever a setting says
# The default cap on draft length. The planner picks each step's length below it; a cap of 48 let copies draft
# as long as llama.cpp's ngram-simple does (48) and replayed (engine.measure.replay) level or better than 32 on
# every tuning set (SmolLM2 grounded 1.525x -> 1.576x plain; 64 lost 3% on Gemma's), level on the held-out.
DEFAULT_MAX_DRAFT = 48
DEFAULT_MIN_DRAFT = 1  # shorter proposals are not worth a verify row: decode plainly instead
MAX_DRAFT_RANGE = (0, MAX_DRAFT_LIMIT)  # 0: never draft
MIN_DRAFT_RANGE = (1, MAX_DRAFT_LIMIT)  # and at most the max draft (checked where both are known)
# The most tokens an MTP head drafts in a step. Its drafts feed on its own hidden rows, so they fade with depth
# (llama.cpp's draft-mtp drafts 3 by default), and a hybrid target (Qwen3.5) keeps a snapshot of its recurrent state
# per token it may roll back (n_rs_seq), each as large as the state itself.
MTP_MAX_DRAFT = 8

# --- the draft model's confidence cutoff --------------------------------------------------------
DEFAULT_P_MIN = 0.75  # the draft stops drafting when its top token's probability falls below this
P_MIN_RANGE = (0.0, 1.0)  # lower bound included, upper excluded: at 1.0 it would never draft
