"""Builds a ready decoder from plain settings: the one place that wires models to proposers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import EngineError, InvalidSettingError, SpeculationUnavailable
from ..methods import (
    AUTO,
    DEFAULT_MAX_DRAFT,
    DEFAULT_METHOD,
    DEFAULT_MIN_DRAFT,
    DEFAULT_P_MIN,
    DRAFT_METHODS,
    METHODS,
    MTP_MAX_DRAFT,
    MTP_METHODS,
)
from ..modelfiles.embedded import resolve_model
from ..modelfiles.model_inspect import HEAD_ARCHS, has_mtp_layers, inspect_model
from .generate import SpeculativeDecoder
from .proposers.base import NoProposer, Proposer
from .proposers.lookup import DEFAULT_MAX_NGRAM
from .proposers.registry import proposer_for
from .runtime import LoadSettings, Model
from .speculation_config import SpeculationConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecoderSettings:
    model: str = "embedded"
    draft: str | None = None
    method: str = DEFAULT_METHOD
    max_draft: int = DEFAULT_MAX_DRAFT
    min_draft: int = DEFAULT_MIN_DRAFT
    adaptive: bool = True
    p_min: float = DEFAULT_P_MIN
    min_ngram: int = 1
    max_ngram: int = DEFAULT_MAX_NGRAM
    remember_requests: bool = True  # lookup also searches earlier answers (off where prompts repeat: bench)
    n_ctx: int = 4096
    n_gpu_layers: int = -1
    threads: int | None = None
    flash_attention: bool | None = None  # None = llama.cpp's choice (runtime.flash_attention_type)
    exact: bool = False  # exact greedy: verifies only as wide as decode bit for bit like plain steps

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InvalidSettingError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not self.draft and needs_draft_model(self.method, self.model):
            raise InvalidSettingError(f"The {self.method} method needs a draft model.")

    def speculation(self) -> SpeculationConfig:
        return SpeculationConfig(
            max_draft=self.max_draft,
            min_draft=min(self.min_draft, max(self.max_draft, 1)),
            adaptive=self.adaptive,
            exact=self.exact,
        )

    def load_settings(self, n_seq_max: int = 1, mtp: bool = False, head: bool = False) -> LoadSettings:
        """How to load a model; mtp: with its MTP layers (loads_mtp says when the target needs them); head: the target
        of a draft head (EAGLE-3), which drafts as deep as an MTP head does."""
        return LoadSettings(
            n_ctx=self.n_ctx,
            n_gpu_layers=self.n_gpu_layers,
            threads=self.threads,
            n_seq_max=n_seq_max,
            flash_attention=self.flash_attention,
            mtp=mtp,
            # a hybrid target rolls back as many rejected drafts as its recurrent state keeps snapshots
            n_rs_seq=min(self.max_draft, MTP_MAX_DRAFT) if mtp or head else 0,
        )


def load_target(settings: DecoderSettings, n_seq_max: int = 1, strict: bool = True) -> Model:
    """The target, loaded as the method needs it. strict: a method the file cannot serve (mtp without MTP layers)
    is refused before loading (the CLIs); not strict, the model loads and that method's proposer says why it
    cannot draft (the chat: a model is never lost to a speculation setting)."""
    path = resolve_model(settings.model)
    if strict and settings.method in MTP_METHODS:
        require_mtp_layers(path, settings.method)
    head = bool(settings.draft) and settings.method in DRAFT_METHODS and _is_head(settings.draft)
    return Model(path, settings.load_settings(n_seq_max, mtp=loads_mtp(settings.method, path), head=head))


def _is_head(draft: str | None) -> bool:
    """Whether the draft file is a draft head (EAGLE-3 / DFlash) rather than a model, from its header."""
    try:
        drafter = inspect_model(resolve_model(str(draft)))["drafter"]
    except EngineError:
        return False  # loading it says why
    return bool(drafter) and drafter.get("kind") in HEAD_ARCHS


def loads_mtp(method: str, model: str | Path) -> bool:
    """Whether a target is loaded with its MTP layers: for the mtp method, and for auto where the file has them (its
    MTP head then drafts beside lookup and any draft model)."""
    if method in MTP_METHODS:
        return True
    return method == AUTO.key and _has_mtp_layers(model)


def needs_draft_model(method: str, model: str | Path) -> bool:
    """Whether the method cannot draft without a draft model: auto can on a target with MTP layers."""
    if method not in DRAFT_METHODS:
        return False
    return method != AUTO.key or not _has_mtp_layers(model)


def _has_mtp_layers(model: str | Path) -> bool:
    try:
        return has_mtp_layers(resolve_model(str(model)))
    except EngineError:
        return False  # a model that cannot be found: loading it says why


def require_mtp_layers(path: str | Path, method: str) -> None:
    """A method that drafts with the target's MTP layers needs a file that has them (its header says so)."""
    drafter = inspect_model(path)["drafter"]
    if not drafter or drafter.get("kind") != "mtp":
        raise InvalidSettingError(
            f"The {method} method drafts with a model's own MTP (nextn) layers, and {Path(path).name} has none: "
            "choose a model that ships them (Qwen3.5, Qwen3-Next, GLM-4.5, DeepSeek-V3 and later) or another method."
        )


def load_draft(settings: DecoderSettings, target: Model, n_seq_max: int = 1) -> Model | None:
    if not settings.draft:
        return None
    # Even the target's own file gets a context of its own, so the two KV caches stay independent.
    return Model(resolve_model(settings.draft), settings.load_settings(n_seq_max))


def require_rollback(*models: Model | None) -> None:
    """Speculation undoes rejected guesses by cutting the KV cache back; some models cannot."""
    for model in models:
        if model is not None and not (model.can_roll_back or model.max_rollback):
            raise SpeculationUnavailable(
                f"{model.name} is a recurrent or hybrid model (such as Mamba, RWKV, LFM2 or Granite 4 H): its "
                "state cannot be rolled back after a rejected guess, so it runs without speculation."
            )


def make_proposer(settings: DecoderSettings, target: Model, draft: Model | None) -> Proposer:
    settings.speculation()  # validates the draft lengths
    if settings.method != "none":
        require_rollback(target, draft)
    return proposer_for(
        settings.method,
        target,
        draft,
        p_min=settings.p_min,
        min_ngram=settings.min_ngram,
        max_ngram=settings.max_ngram,
        remember_requests=settings.remember_requests,
    )


def build_decoder(settings: DecoderSettings) -> SpeculativeDecoder:
    """Load the target (and draft) and return a decoder; raises EngineError subclasses on bad input."""
    target = load_target(settings)
    try:
        draft = load_draft(settings, target) if settings.method in DRAFT_METHODS else None
        try:
            proposer = make_proposer(settings, target, draft)
        except SpeculationUnavailable as exc:
            log.warning("%s", exc)
            proposer = NoProposer()
    except Exception:
        target.close()
        raise
    return SpeculativeDecoder(target, proposer, settings.speculation())
