"""The chat's decoder (and the bench's): one slot of a Batch (batch.py), pumped by the one loop (pump.py), that
keeps its KV cache between answers, so a chat only processes the new part of its prompt, streaming text as it is
produced."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import torch

from ..errors import ContextOverflowError, InvalidSettingError
from .answer import Delta
from .batch import Batch
from .calibration import Progress
from .jobs import job_for
from .proposers.base import Proposer
from .pump import ADMITTED, pump
from .runtime import Model
from .sampling import SamplingParams, pick_device
from .speculation_config import SpeculationConfig
from .stats import GenerationStats
from .step import StepLoop
from .step_costs import StepCosts

CHAT_SLOT = 0  # the chat's one sequence


class SpeculativeDecoder:
    """Generates from a target model with any proposer, one answer at a time."""

    def __init__(
        self,
        target: Model,
        proposer: Proposer | None = None,
        speculation: SpeculationConfig | None = None,
        device: torch.device | None = None,
    ):
        self.target = target
        self.device = device or pick_device()
        self.stats = GenerationStats()
        self._step_costs = StepCosts()  # the machine's and the model's: kept whatever the speculation
        self.batch = self._new_batch(proposer, speculation or SpeculationConfig())

    def set_speculation(self, proposer: Proposer | None, speculation: SpeculationConfig) -> None:
        """Change how the next response speculates, keeping the loaded models, the KV cache and the
        measured step costs. Until the next change the planner is kept across responses, so acceptance
        follows the conversation."""
        batch = self._new_batch(proposer, speculation)
        batch.kv.take_over(self.batch.kv)
        self.batch = batch

    def _new_batch(self, proposer: Proposer | None, speculation: SpeculationConfig) -> Batch:
        # Whole prompts at once (Model.prefill's chunks): one answer at a time has no other stream to let through.
        return Batch.build(
            self.target,
            proposer,
            speculation,
            1,
            self.device,
            self._step_costs,
            keep_caches=True,
            prefill_chunk=self.target.n_batch,
            reuse_prompt_logits=True,
        )

    @property
    def loop(self) -> StepLoop:
        return self.batch.loop

    def calibrate(self, on_progress: Progress | None = None) -> None:
        """Time every verify size now (once per loaded model: ~2.5 s for SmolLM2 135M, ~3.5 s for Gemma 3
        270M on this 2-core CPU), so the first answer neither waits for it nor guesses. Uses free cells after
        the cached tokens. on_progress(done, total, seconds_left) hears of each timing."""
        cached = self.batch.kv.cached.get(CHAT_SLOT)
        token = cached[-1] if cached else max(self.target.bos, 0)
        self.loop.calibrate(CHAT_SLOT, self.target.next_position(CHAT_SLOT), token, on_progress=on_progress)

    def forget(self) -> None:
        """Empty the KV cache: the next prompt is processed from its first token (a benchmark's fresh start)."""
        self.batch.kv.forget()
        self.target.forget_all()

    @property
    def proposer(self) -> Proposer:
        return self.loop.proposer

    @proposer.setter
    def proposer(self, proposer: Proposer) -> None:
        self.loop.proposer = proposer

    @property
    def speculation(self) -> SpeculationConfig:
        return self.loop.speculation

    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams = SamplingParams(),
        max_tokens: int = 256,
        ignore_eos: bool = False,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
    ) -> Iterator[Delta]:
        """Yield Deltas as tokens are produced; self.stats is live throughout and final afterwards."""
        if not prompt:
            raise InvalidSettingError("The prompt is empty.")
        if not (isinstance(max_tokens, int) and max_tokens >= 1):
            raise InvalidSettingError(f"max_tokens must be a whole number ≥ 1, got {max_tokens!r}")
        if len(prompt) >= self.target.n_ctx:
            raise ContextOverflowError(
                f"The prompt is {len(prompt)} tokens; the context holds {self.target.n_ctx}, and room is needed "
                "for the answer. Shorten it or raise the context size in Settings."
            )
        deltas: list[Delta] = []
        job = job_for(
            "chat",
            prompt,
            sampling,
            max_tokens,
            ignore_eos,
            stop=stop,
            cancel=cancel,
            on_delta=lambda _job, delta: deltas.append(delta),
        )
        batch = self.batch
        self.loop.planner.begin_request()
        self.target.set_interrupt(job.cancel.is_set)  # Stop ends even a verify part-way
        try:
            batch.submit(job)
            for phase in pump(batch):
                if phase is ADMITTED and job.run is not None:
                    self.stats = job.run.stats
                yield from self._hand_on(deltas)
        finally:
            self.target.set_interrupt(None)
            if not batch.idle:  # the caller stopped listening: end the answer, keeping the cache consistent
                job.cancel.set()
                batch.admit()

    @staticmethod
    def _hand_on(deltas: list[Delta]) -> Iterator[Delta]:
        while deltas:
            yield deltas.pop(0)
