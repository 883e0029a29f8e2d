"""Speculation lab: plain vs speculative decoding as concurrency rises, on this machine (run_lab).
The command is cli.py (`python -m engine.lab`); the same experiment against running servers is remote.py.
"""

from __future__ import annotations

import math
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import llama_cpp
import torch

from ..chat_format import ChatFormatter
from ..decoding.batch_decode import BatchDecoder, BatchProgress, BatchRequest, BatchResult
from ..decoding.loader import loads_mtp, needs_draft_model, require_mtp_layers, require_rollback
from ..decoding.proposers.registry import proposer_for
from ..decoding.runtime import LoadSettings, Model
from ..decoding.sampling import SamplingParams
from ..decoding.speculation_config import SpeculationConfig
from ..errors import InvalidSettingError
from ..methods import DRAFT_METHODS, METHODS, MTP_MAX_DRAFT, MTP_METHODS
from ..modelfiles.embedded import resolve_model
from .bench import read_prompts
from .crossover import least_disturbed
from .metrics import UtilisationMeter, memory_figure, summarise_cell
from .schema import SCHEMA, LabProgress, cell_progress

CTX_ALIGN = 256


@dataclass
class LabConfig:
    prompts: str  # a JSON-lines file of {"id", "prompt"}
    model: str = "embedded"
    draft: str | None = None
    methods: tuple[str, ...] = ("none", "lookup")
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    max_tokens: int = 128
    max_draft: int = 8
    adaptive: bool = True  # the chat's default: measured acceptance and step times pick draft lengths
    temperature: float = 0.0
    seed: int = 0
    threads: int | None = None
    n_gpu_layers: int = -1
    ignore_eos: bool = True  # every request decodes max_tokens: the same work for every method
    repeats: int = 1  # runs per cell; the fastest is kept (a shared machine only slows runs down)
    chat: bool = False  # each prompt as one user message in the model's chat template (an instruct model's use)

    def __post_init__(self) -> None:
        self.methods = tuple(self.methods)
        self.concurrency = tuple(sorted(set(self.concurrency)))
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise InvalidSettingError(f"methods must be some of {', '.join(METHODS)}, got {list(self.methods)}")
        if not self.draft and any(needs_draft_model(m, self.model) for m in self.methods):
            raise InvalidSettingError("The draft and auto methods need a draft model (--draft PATH or embedded).")
        if not self.concurrency or any(not isinstance(c, int) or not 1 <= c <= 64 for c in self.concurrency):
            raise InvalidSettingError(f"concurrency levels must be whole numbers 1..64, got {list(self.concurrency)}")
        if not (isinstance(self.max_tokens, int) and 1 <= self.max_tokens <= 8192):
            raise InvalidSettingError(f"max tokens must be 1..8192, got {self.max_tokens!r}")
        if not (isinstance(self.repeats, int) and 1 <= self.repeats <= 20):
            raise InvalidSettingError(f"repeats must be 1..20, got {self.repeats!r}")
        SpeculationConfig(max_draft=self.max_draft, adaptive=self.adaptive)  # validates the draft length
        SamplingParams(temperature=self.temperature, seed=self.seed)


def plan_requests(prompts: list[dict], tokenize, concurrency: int) -> list[BatchRequest]:
    """Every prompt at least once, and a whole number of rounds of `concurrency` requests, so each
    level is measured on the same prompts (fillers keep it at that concurrency to the end: BatchDecoder.run)."""
    count = concurrency * math.ceil(len(prompts) / concurrency)
    tokens = [tokenize(p["prompt"]) for p in prompts]
    return [BatchRequest(f"{prompts[i % len(prompts)]['id']}#{i}", tokens[i % len(prompts)]) for i in range(count)]


def prompt_tokenizer(model: Model, chat: bool) -> Callable[[str], list[int]]:
    """A prompt's tokens: the raw text, or (chat) one user message through the model's chat template."""
    if not chat:
        return model.tokenize
    formatter = ChatFormatter(model)
    return lambda text: formatter.render([{"role": "user", "content": text}])[1]


def context_size(longest_prompt: int, config: LabConfig) -> int:
    """The unified KV cache holds every sequence in flight: size it for the busiest level."""
    per_sequence = longest_prompt + config.max_tokens + config.max_draft + 2
    need = max(config.concurrency) * per_sequence
    return CTX_ALIGN * math.ceil(need / CTX_ALIGN)


def _drafter(method: str, target: Model, draft: Model | None):
    # Requests repeat the same prompts: earlier answers would be copied, which a user never sees.
    return proposer_for(method, target, draft, remember_requests=False)


def run_lab(
    config: LabConfig,
    on_progress: Callable[[LabProgress], None] | None = None,
    on_cell: Callable[[dict], None] | None = None,
    cancel: threading.Event | None = None,
) -> dict:
    """Run every (method, concurrency) cell; return the results document (see SCHEMA).
    Raises GenerationCancelled when cancel is set, EngineError subclasses on bad input."""
    cancel = cancel or threading.Event()
    prompts = read_prompts(config.prompts)
    if not prompts:
        raise InvalidSettingError(f"{config.prompts} holds no prompts")
    load, longest = _load_settings(config, prompts)
    slots = load.n_seq_max
    target = Model(resolve_model(config.model), load)
    draft = None
    try:
        if load.n_ctx > target.n_ctx:
            raise InvalidSettingError(
                f"{slots} sequences of up to {longest + config.max_tokens} tokens need a "
                f"{load.n_ctx}-token context; this model holds {target.n_ctx}. "
                "Lower the concurrency or max tokens."
            )
        if config.draft and set(config.methods) & set(DRAFT_METHODS):
            draft = Model(resolve_model(config.draft), load)
            if load.n_ctx > draft.n_ctx:  # its cache follows every sequence too
                raise InvalidSettingError(
                    f"The draft model holds {draft.n_ctx} tokens; {slots} sequences need "
                    f"{load.n_ctx}. Lower the concurrency or max tokens."
                )
        if set(config.methods) - {"none"}:
            require_rollback(target, draft)
        cells = _measure_levels(config, target, draft, prompts, on_progress, on_cell, cancel)
        return {
            "schema": SCHEMA,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "settings": {**asdict(config), "prompt_set": Path(config.prompts).stem, "prompt_count": len(prompts)},
            "env": _environment(target, draft, load),
            "cells": cells,
        }
    finally:
        target.close()
        if draft is not None:
            draft.close()


def _load_settings(config: LabConfig, prompts: list[dict]) -> tuple[LoadSettings, int]:
    """How to load the models, their context sized for the busiest level; and the longest prompt's tokens."""
    probe = Model(resolve_model(config.model), vocab_only=True)  # tokenize first, to size the context
    tokenize = prompt_tokenizer(probe, config.chat)
    longest = max(len(tokenize(p["prompt"])) for p in prompts)
    probe.close()
    if any(m in MTP_METHODS for m in config.methods):
        require_mtp_layers(resolve_model(config.model), "mtp")
    mtp = any(loads_mtp(m, config.model) for m in config.methods)
    load = LoadSettings(
        n_ctx=context_size(longest, config),
        n_gpu_layers=config.n_gpu_layers,
        threads=config.threads,
        n_seq_max=max(config.concurrency),
        mtp=mtp,  # loaded once for every method: plain and lookup run on the same context as the MTP head
        n_rs_seq=min(config.max_draft, MTP_MAX_DRAFT) if mtp else 0,
    )
    return load, longest


def _measure_levels(
    config: LabConfig,
    target: Model,
    draft: Model | None,
    prompts: list[dict],
    on_progress: Callable[[LabProgress], None] | None,
    on_cell: Callable[[dict], None] | None,
    cancel: threading.Event,
) -> list[dict]:
    """Every cell, concurrency-major with the methods alternating in each level; the fastest run of each kept."""
    sampling = SamplingParams(temperature=config.temperature, seed=config.seed)
    speculation = SpeculationConfig(max_draft=config.max_draft, adaptive=config.adaptive)
    _warm_up(target, sampling, prompts)
    cells: list[dict] = []
    per_level = [(repeat, m) for repeat in range(config.repeats) for m in config.methods]
    cells_total = len(config.concurrency) * len(per_level)
    index = 0
    for concurrency in config.concurrency:
        requests = plan_requests(prompts, prompt_tokenizer(target, config.chat), concurrency)
        expected = len(requests) * config.max_tokens
        measured: dict[str, list[dict]] = {m: [] for m in config.methods}
        for _, method in per_level:  # methods alternate, so outside load falls on them alike
            decoder = BatchDecoder(target, _drafter(method, target, draft), speculation)

            def progress(
                p: BatchProgress, index=index, concurrency=concurrency, method=method, expected=expected
            ) -> None:
                if on_progress:
                    on_progress(
                        cell_progress(index, cells_total, method, concurrency, p.generated, expected, p.elapsed_s)
                    )

            with UtilisationMeter(target.backend) as meter:
                result = decoder.run(
                    requests,
                    concurrency,
                    sampling,
                    config.max_tokens,
                    ignore_eos=config.ignore_eos,
                    cancel=cancel,
                    on_progress=progress,
                    keep_full=True,
                )
            measured[method].append(_cell(result, method, concurrency, meter, target.backend))
            index += 1
        for method in config.methods:
            cell = least_disturbed(measured[method])
            cells.append(cell)
            if on_cell:
                on_cell(cell)
    return cells


def _cell(result: BatchResult, method: str, concurrency: int, meter: UtilisationMeter, backend: str) -> dict:
    cell = summarise_cell(result, method, concurrency)
    assert meter.result is not None  # the meter has stopped: the cell ran
    cell["utilisation"] = meter.result.to_dict()
    cell["memory"] = memory_figure(backend)
    return cell


def _warm_up(target: Model, sampling: SamplingParams, prompts: list[dict]) -> None:
    """First decodes allocate buffers and fault pages in: keep that out of the first cell."""
    request = BatchRequest("warm-up", target.tokenize(prompts[0]["prompt"]))
    BatchDecoder(target).run([request], 1, sampling, max_tokens=4, ignore_eos=True)


def _environment(target: Model, draft: Model | None, load: LoadSettings) -> dict:
    return {
        "model": str(target.path),
        "model_name": target.name,
        "draft": str(draft.path) if draft else None,
        "backend": target.backend,
        "threads": load.resolved_threads(),
        "n_ctx": target.n_ctx,
        "n_seq_max": load.n_seq_max,
        "llama_cpp_python": llama_cpp.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "platform": platform.platform(),
    }
