"""A smaller GGUF model of the same vocabulary drafts tokens, keeping q for the verifier.

Its own context and KV cache follow the conversation lazily: each proposal first decodes whatever
the target accepted since the last one (the cache is cut back to the common prefix), then drafts
one token at a time, stopping early when its confidence falls below p_min (llama.cpp's rule).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ...errors import InvalidSettingError
from ..runtime import Model, common_prefix
from ..sampling import Candidates, SamplingParams, filter_logits, make_generator, position_seed
from ...modelfiles.vocab_check import require_compatible
from .base import Proposal


def stack_candidates(rows: list[Candidates]) -> Candidates:
    width = max(r.ids.shape[1] for r in rows)
    pad = [(width - r.ids.shape[1]) for r in rows]
    ids = torch.cat([torch.nn.functional.pad(r.ids, (0, p)) for r, p in zip(rows, pad)])
    probs = torch.cat([torch.nn.functional.pad(r.probs, (0, p)) for r, p in zip(rows, pad)])
    return Candidates(ids=ids, probs=probs)


def check_draft(draft: Model, target: Model, p_min: float) -> None:
    """A usable draft: a cutoff in range and a vocabulary the target can verify."""
    if not 0.0 <= p_min < 1.0:
        raise InvalidSettingError(f"draft confidence cutoff must be in [0, 1), got {p_min!r}")
    require_compatible(target, draft)


class DraftModelProposer:
    name = "draft"
    free = False

    def __init__(self, draft: Model, target: Model, p_min: float = 0.75):
        check_draft(draft, target, p_min)
        self.model = draft
        self.p_min = p_min
        self._cached: list[int] = []  # tokens in the draft's KV cache
        self._sampling = SamplingParams(temperature=0.0)
        self._device = torch.device("cpu")
        self._generator: torch.Generator | None = None
        self._seed = 0

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, device: torch.device, seed: int) -> None:
        self._sampling = sampling
        self._device = device
        self._seed = seed + 1  # its own stream, still reproducible
        self._generator = make_generator(self._seed, device)
        # Process the prompt as the target does (one prefill), so draft == target gives equal logits.
        self._sync(prompt)

    def _sync(self, tokens: Sequence[int]) -> np.ndarray:
        """Bring the draft's KV cache to `tokens`, decoding only what it lacks; logits of the last one."""
        keep = min(common_prefix(self._cached, tokens), len(tokens) - 1)
        self.model.forget_from(keep)
        self._cached = list(tokens)
        return self.model.prefill(tokens[keep:], keep)

    def propose(self, history: Sequence[int], max_tokens: int) -> Proposal:
        if max_tokens <= 0:
            return Proposal()
        model = self.model
        room = model.n_ctx - len(history)
        max_tokens = min(max_tokens, room)
        if max_tokens <= 0:
            return Proposal()
        logits = self._sync(history)
        drafts: list[int] = []
        q_rows: list[Candidates] = []
        greedy = self._sampling.greedy
        while True:
            row = logits[0]
            if greedy:
                token = int(row.argmax())
                confidence = 1.0 / float(np.exp(row - row[token]).sum())
            else:
                q = filter_logits(torch.from_numpy(row).to(self._device).view(1, -1), self._sampling)
                confidence = float(q.probs[0].max())
                self._generator.manual_seed(position_seed(self._seed, len(history) + len(drafts)))
                token = q.sample(0, self._generator)
            if confidence < self.p_min:
                break
            drafts.append(token)
            if not greedy:
                q_rows.append(q)
            if len(drafts) == max_tokens:
                break
            logits = model.decode([token], len(self._cached), 1)
            self._cached.append(token)
        probs = stack_candidates(q_rows) if q_rows else None
        return Proposal(tokens=drafts, probs=probs)

    def feedback(self, drafted: int, accepted: int) -> None:
        pass
