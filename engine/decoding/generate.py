"""The decode loop: prefill, then { draft ≤ k → verify [last, d1..dk] in one batch → keep a prefix
plus one target token → roll the KV cache back } until a stop. One straight line, per DESIGN.md."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch

from .draft_policy import DraftLengthPolicy, SpeculationConfig
from ..errors import ContextOverflowError, GenerationCancelled, InvalidSettingError
from ..hardware import read_memory
from .proposers.base import NoProposer, Proposer
from .runtime import Model, common_prefix
from .sampling import SamplingParams, pick_device, request_seed
from .stats import GenerationStats
from .stop_strings import StopMatcher
from .text_stream import TextStream
from .verifier import Verifier

MEMORY_EVERY_S = 0.5  # memory readings cost a syscall (or an NVML call): not every step


@dataclass
class Delta:
    """Newly produced tokens and their text; from_draft marks tokens that came from accepted drafts."""

    tokens: list[int]
    segments: list[tuple[str, bool]] = field(default_factory=list)  # (text, from_draft) per token

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.segments)


class SpeculativeDecoder:
    """Generates from a target model with any proposer. Keeps the KV cache between requests, so a
    chat only processes the new part of its prompt."""

    def __init__(self, target: Model, proposer: Proposer | None = None,
                 speculation: SpeculationConfig | None = None, device: torch.device | None = None):
        self.target = target
        self.proposer = proposer or NoProposer()
        self.speculation = speculation or SpeculationConfig()
        self.device = device or pick_device()
        self.stats = GenerationStats()
        self._cached: list[int] = []  # tokens whose KV is in the target's cache, in order
        self._prompt_logits: tuple[tuple[int, ...], np.ndarray] | None = None  # the last prompt's own logits
        self._policy = self._new_policy()

    def set_speculation(self, proposer: Proposer | None, speculation: SpeculationConfig) -> None:
        """Change how the next response speculates, keeping the loaded models and the KV cache."""
        self.proposer = proposer or NoProposer()
        self.speculation = speculation
        self._policy = self._new_policy()

    def _new_policy(self) -> DraftLengthPolicy:
        # Kept across responses: step costs are the machine's, acceptance follows the conversation.
        return DraftLengthPolicy(self.speculation, costly_proposer=not self.proposer.free)

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
        target, proposer = self.target, self.proposer
        if not target.can_roll_back:
            proposer = NoProposer()  # a rejected guess could not be undone (loader.require_rollback says so)
        if len(prompt) >= target.n_ctx:
            raise ContextOverflowError(
                f"The prompt is {len(prompt)} tokens; the context holds {target.n_ctx}, and room is needed "
                "for the answer. Shorten it or raise the context size in Settings."
            )
        cancel = cancel or threading.Event()
        stats = self.stats = GenerationStats(method=proposer.name, backend=target.backend,
                                             prompt_tokens=len(prompt))
        started = time.perf_counter()
        seed = request_seed(sampling)
        verifier = Verifier(sampling, self.device, seed)
        policy = self._policy
        policy.begin_request()
        speculating = not isinstance(proposer, NoProposer) and self.speculation.max_draft > 0
        text, stopper = TextStream(), StopMatcher(stop)
        target.set_interrupt(cancel.is_set)
        try:
            logits = self._prefill(prompt, cancel)
        except GenerationCancelled:
            target.set_interrupt(None)
            stats.finish_reason = "cancelled"
            return
        first = verifier.verify(logits, [], None, position=len(prompt)).next_token
        stats.prefill_s = time.perf_counter() - started

        history = list(prompt)
        decoded = len(history)  # positions the target's cache holds
        proposer_begun = False
        shadow: list[int] = []  # a free proposal scored against what the target produced instead
        shadow_hits = 0
        memory_read_at = 0.0
        new_tokens, from_draft = [first], [False]
        first_token_at = time.perf_counter()
        stats.ttft_s = first_token_at - started

        while True:
            # --- emit what the last step produced, and see whether we are done -------------------
            finish = None
            for i, tok in enumerate(new_tokens):
                if target.is_end(tok) and not ignore_eos:
                    new_tokens, from_draft, finish = new_tokens[:i], from_draft[:i], "stop"
                    break
            budget = max_tokens - stats.generated
            if len(new_tokens) >= budget:
                new_tokens, from_draft, finish = new_tokens[:budget], from_draft[:budget], finish or "length"
            shown, hit_stop = [], False
            for i, (tok, drafted) in enumerate(zip(new_tokens, from_draft)):  # token by token, to stop exactly
                released, hit_stop = stopper.push([(text.push(target.piece(tok)), drafted)])
                shown += released
                if hit_stop:  # tokens accepted past a stop string are neither shown nor counted
                    new_tokens, from_draft, finish = new_tokens[:i + 1], from_draft[:i + 1], "stop"
                    break
            history += new_tokens
            stats.generated += len(new_tokens)
            now = time.perf_counter()
            stats.decode_s = now - first_token_at
            if now - memory_read_at > MEMORY_EVERY_S:
                stats.memory, memory_read_at = read_memory(target.backend), now
            if stats.decode_tokens_per_s:
                stats.rate_history.append((now - started, stats.decode_tokens_per_s))
            if finish:
                shown += stopper.flush() if not hit_stop else []
                tail = text.flush()
                if tail and not hit_stop:
                    shown.append((tail, False))
            if new_tokens or shown:
                yield Delta(tokens=new_tokens, segments=shown)
            if finish is None and cancel.is_set():
                finish = "cancelled"
            if finish is None and len(history) >= target.n_ctx:
                finish = "context"
            for tok in new_tokens:  # score a shadow proposal slot by slot, as the real tokens arrive
                if not shadow:
                    break
                hit = shadow[shadow_hits] == tok
                policy.record_slot(shadow_hits, hit)
                shadow_hits += 1
                if not hit or shadow_hits == len(shadow):
                    shadow, shadow_hits = [], 0
            if finish:
                target.set_interrupt(None)
                stats.finish_reason = finish
                stats.memory = read_memory(target.backend)
                self._cached = history[:decoded]  # exactly what the cache holds (a recurrent state must match)
                return

            if not proposer_begun:  # only now, so the first token never waits for a draft model's prefill
                t = time.perf_counter()
                proposer.begin(prompt, sampling, self.device, seed)
                stats.draft_s += time.perf_counter() - t
                proposer_begun = True

            # --- one step: draft, verify in one batch, keep a prefix plus one target token -------
            room = min(max_tokens - stats.generated - 1, target.n_ctx - len(history), target.n_batch - 1)
            chosen = policy.choose() if speculating else 0
            k = min(chosen, max(room, 0))
            stats.policy_draft_length, stats.draft_length = chosen, k
            # Paused only when the policy predicted plain decoding faster, not when the room ran out.
            stats.speculation_paused = (speculating and self.speculation.adaptive and chosen == 0
                                        and not policy.measuring_plain)  # a plain step taken to measure it
            proposal_tokens, q = [], None
            if k >= self.speculation.min_draft:
                t = time.perf_counter()
                proposal = proposer.propose(history, k)
                spent = time.perf_counter() - t
                stats.draft_s += spent
                policy.record_draft(len(proposal.tokens), spent)
                if len(proposal.tokens) >= self.speculation.min_draft:
                    proposal_tokens, q = proposal.tokens, proposal.probs
            elif speculating and proposer.free and not shadow:
                shadow = proposer.propose(history, self.speculation.max_draft).tokens

            pos = len(history) - 1
            t = time.perf_counter()
            try:
                logits = target.decode([history[-1], *proposal_tokens], pos, len(proposal_tokens) + 1)
            except GenerationCancelled:  # Stop arrived mid-verify: drop the half-processed batch
                target.forget_from(pos)
                decoded = pos
                new_tokens, from_draft = [], []
                continue
            verdict = verifier.verify(logits, proposal_tokens, q, position=len(history))
            policy.record_step(len(proposal_tokens) + 1, time.perf_counter() - t)
            decoded = pos + 1 + verdict.accepted  # the last token kept is decoded by the next step
            target.forget_from(decoded)
            stats.verify_steps += 1
            if proposal_tokens:
                stats.speculative_steps += 1
                stats.record_verdict(len(proposal_tokens), verdict.accepted)
                policy.record_acceptance(len(proposal_tokens), verdict.accepted)
                proposer.feedback(len(proposal_tokens), verdict.accepted)
            new_tokens = [*proposal_tokens[:verdict.accepted], verdict.next_token]
            from_draft = [True] * verdict.accepted + [False]
