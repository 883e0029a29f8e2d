"""The chat's decode loop: prefill (reusing the KV cache the last answer left), then the one batched
step (step.py) with a single sequence until a stop, streaming text as it is produced."""
from __future__ import annotations

import threading
import time
from typing import Iterator, Sequence

import numpy as np
import torch

from ..errors import ContextOverflowError, GenerationCancelled, InvalidSettingError
from ..hardware import read_memory
from .answer import AnswerStream, Delta
from .cost_model import SpeculationConfig, StepCosts
from .proposers.base import Proposer
from .runtime import Model, common_prefix
from .sampling import SamplingParams, pick_device, request_seed
from .stats import GenerationStats
from .step import SequenceState, StepLoop
from .verifier import Verifier

MEMORY_EVERY_S = 0.5  # memory readings cost a syscall (or an NVML call): not every step
CHAT_SLOT = 0  # the chat's one sequence


class SpeculativeDecoder:
    """Generates from a target model with any proposer. Keeps the KV cache between requests, so a
    chat only processes the new part of its prompt."""

    def __init__(self, target: Model, proposer: Proposer | None = None,
                 speculation: SpeculationConfig | None = None, device: torch.device | None = None):
        self.target = target
        self.device = device or pick_device()
        self.stats = GenerationStats()
        self._cached: list[int] = []  # tokens whose KV is in the target's cache, in order
        self._prompt_logits: tuple[tuple[int, ...], np.ndarray] | None = None  # the last prompt's own logits
        self._step_costs = StepCosts()  # the machine's and the model's: kept whatever the speculation
        self.set_speculation(proposer, speculation or SpeculationConfig())

    def set_speculation(self, proposer: Proposer | None, speculation: SpeculationConfig) -> None:
        """Change how the next response speculates, keeping the loaded models, the KV cache and the
        measured step costs. Until the next change the planner is kept across responses, so acceptance
        follows the conversation."""
        self.loop = StepLoop(self.target, proposer, speculation, self.device, step_costs=self._step_costs)

    def calibrate(self) -> None:
        """Time every verify size now (once per loaded model: ~2.5 s for SmolLM2 135M, ~3.5 s for Gemma 3
        270M on this 2-core CPU), so the first answer neither waits for it nor guesses. Uses free cells after
        the cached tokens."""
        token = self._cached[-1] if self._cached else max(self.target.bos, 0)
        self.loop.calibrate(CHAT_SLOT, self.target.next_position(CHAT_SLOT), token)

    def forget(self) -> None:
        """Empty the KV cache: the next prompt is processed from its first token (a benchmark's fresh start)."""
        self.target.forget_all()
        self._cached, self._prompt_logits = [], None

    @property
    def proposer(self) -> Proposer:
        return self.loop.proposer

    @proposer.setter
    def proposer(self, proposer: Proposer) -> None:
        self.loop.proposer = proposer

    @property
    def speculation(self) -> SpeculationConfig:
        return self.loop.speculation

    def _prefill(self, prompt: Sequence[int], cancel: threading.Event) -> np.ndarray:
        """Logits after the prompt, decoding only what the KV cache lacks."""
        target = self.target
        reused = common_prefix(self._cached, prompt)
        if not target.can_roll_back and (reused < len(self._cached) or reused == len(prompt)):
            reused = 0  # a recurrent state cannot be cut back part-way: start again from the first token
        if reused == len(prompt) and self._prompt_logits is not None and self._prompt_logits[0] == tuple(prompt):
            # The same prompt again (Regenerate): reuse its logits rather than re-decoding its last
            # token alone, whose logits would differ slightly from the batched prefill's.
            target.forget_from(reused)
            self._cached = list(prompt)
            self.stats.reused_prompt_tokens = reused
            return self._prompt_logits[1]
        keep = min(reused, len(prompt) - 1)  # at least one token is decoded, for fresh logits
        target.forget_from(keep)
        self._cached = list(prompt[:keep])
        self.stats.reused_prompt_tokens = keep
        try:
            logits = target.prefill(prompt[keep:], keep, should_stop=cancel.is_set)
        except GenerationCancelled:
            if not target.can_roll_back:  # a half-read prompt cannot be cut back to where it began
                keep, self._cached = 0, []
            target.forget_from(keep)
            raise
        self._cached = list(prompt)
        self._prompt_logits = (tuple(prompt), logits.copy())
        return logits

    def generate(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(), max_tokens: int = 256,
                 ignore_eos: bool = False, stop: Sequence[str] = (),
                 cancel: threading.Event | None = None) -> Iterator[Delta]:
        """Yield Deltas as tokens are produced; self.stats is live throughout and final afterwards."""
        if not prompt:
            raise InvalidSettingError("The prompt is empty.")
        if not (isinstance(max_tokens, int) and max_tokens >= 1):
            raise InvalidSettingError(f"max_tokens must be a whole number ≥ 1, got {max_tokens!r}")
        target, loop = self.target, self.loop
        if len(prompt) >= target.n_ctx:
            raise ContextOverflowError(
                f"The prompt is {len(prompt)} tokens; the context holds {target.n_ctx}, and room is needed "
                "for the answer. Shorten it or raise the context size in Settings."
            )
        cancel = cancel or threading.Event()
        stats = self.stats = GenerationStats(method=loop.method, backend=target.backend, prompt_tokens=len(prompt),
                                             draft_model_bytes=loop.draft_model_bytes)
        started = time.perf_counter()
        seed = request_seed(sampling)
        verifier = Verifier(sampling, self.device, seed)
        loop.planner.begin_request()
        target.set_interrupt(cancel.is_set)
        try:
            logits = self._prefill(prompt, cancel)
        except GenerationCancelled:
            target.set_interrupt(None)
            stats.finish_reason = "cancelled"
            return
        first = verifier.verify(logits, [], None, position=len(prompt)).next_token
        stats.prefill_s = time.perf_counter() - started

        prompt_list = list(prompt)
        seq = SequenceState(CHAT_SLOT, list(prompt), verifier, stats, stops_at_end=not ignore_eos)
        seq.history.append(first)  # the cache holds every token of seq.history but its last (the KV convention)
        proposer_begun = False
        memory_read_at = 0.0
        first_token_at = time.perf_counter()
        stats.ttft_s = first_token_at - started
        answer = AnswerStream(target, max_tokens, ignore_eos, stop)
        delta = answer.push([first])

        while True:
            # --- emit what the last step produced, and see whether we are done -------------------
            stats.generated = len(answer.tokens)
            # What was really produced: the step's own list while the answer keeps every token (the proposer's
            # history array then grows with it instead of converting a new list each step), cut once it ends.
            history = seq.history if answer.finish is None else prompt_list + answer.tokens
            now = time.perf_counter()
            stats.decode_s = now - first_token_at
            if now - memory_read_at > MEMORY_EVERY_S:
                stats.memory, memory_read_at = read_memory(target.backend), now
            if stats.decode_tokens_per_s:
                stats.rate_history.append((now - started, stats.decode_tokens_per_s))
            if answer.finish is None and cancel.is_set():
                delta.segments += answer.end("cancelled").segments
            if answer.finish is None and len(history) >= target.n_ctx:
                delta.segments += answer.end("context").segments
            if delta.tokens or delta.segments:
                yield delta
            if answer.finish:
                target.set_interrupt(None)
                stats.finish_reason = answer.finish
                stats.memory = read_memory(target.backend)
                decoded = len(seq.history) - 1
                keep = min(decoded, len(history))
                if keep < decoded:  # drafts kept past an end or a stop: their KV goes too
                    target.forget_from(keep)
                self._cached = history[:keep]  # exactly what the cache holds (a recurrent state must match)
                loop.proposer.finish(CHAT_SLOT, history)
                return

            if not proposer_begun:  # only now, so the first token never waits for the proposer
                loop.proposer.start(CHAT_SLOT, prompt, sampling, self.device, seed)
                proposer_begun = True
            seq.history = history
            try:
                outcome = loop.step([seq], [answer.tokens_left])[0]
            except GenerationCancelled:  # Stop arrived mid-verify: the cache is as before the step
                delta = Delta([])
                continue
            delta = answer.push(outcome.tokens, outcome.accepted)
