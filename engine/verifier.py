"""Decides which drafted tokens the target keeps. Always returns at least one token.

Greedy: accept while the draft equals the target's argmax. Sampling: accept d_i with probability
min(1, p(d_i)/q(d_i)); on the first rejection sample from norm(max(0, p - q)) and stop; if all are
accepted, sample the bonus token from p. A prompt-lookup draft is the point-mass case q = δ(d).
This keeps the output distributed exactly as the target's (Leviathan et al. 2023, Chen et al. 2023).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .sampling import Candidates, SamplingParams, filter_logits


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many drafted tokens were kept
    next_token: int  # the recovered token (after a rejection) or the bonus token (all accepted)


def verify_greedy(target_logits: np.ndarray, drafts: Sequence[int]) -> Verdict:
    """Rows are the target's logits after [last, d1..dk]; row i predicts the token at slot i."""
    for i, token in enumerate(drafts):
        best = int(target_logits[i].argmax())
        if best != token:
            return Verdict(i, best)
    return Verdict(len(drafts), int(target_logits[len(drafts)].argmax()))


class Verifier:
    """Greedy or rejection-sampling verification with a seeded torch generator."""

    def __init__(self, params: SamplingParams, device: torch.device, generator: torch.Generator):
        self.params = params
        self.device = device
        self.generator = generator

    def verify(self, target_logits: np.ndarray, drafts: Sequence[int], draft_probs: Candidates | None) -> Verdict:
        """draft_probs: q for each drafted token (a draft model), or None for point-mass drafts (lookup)."""
        if self.params.greedy:
            return verify_greedy(target_logits, drafts)
        k = len(drafts)
        p = filter_logits(torch.from_numpy(target_logits).to(self.device), self.params)
        if k == 0:
            return Verdict(0, p.sample(0, self.generator))
        d = torch.tensor(drafts, dtype=torch.long, device=self.device)
        p_d = p.prob_of(d)
        q_d = torch.ones_like(p_d) if draft_probs is None else draft_probs.prob_of(d)
        u = torch.rand(k, generator=self.generator, device=self.device)
        rejected = (u * q_d > p_d).nonzero()
        if len(rejected) == 0:
            return Verdict(k, p.sample(k, self.generator))
        i = int(rejected[0])
        return Verdict(i, self._sample_residual(p, i, drafts[i], draft_probs, target_logits.shape[1]))

    def _sample_residual(
        self, p: Candidates, row: int, token: int, draft_probs: Candidates | None, vocab_size: int
    ) -> int:
        if draft_probs is None:
            q_on_support = (p.ids[row] == token).to(p.probs.dtype)
        else:
            q_dense = draft_probs.dense_row(row, vocab_size)
            q_on_support = q_dense[p.ids[row]]
        residual = torch.clamp(p.probs[row] - q_on_support, min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: a rejection had ~0 probability
            residual = p.probs[row]
        j = torch.multinomial(residual, 1, generator=self.generator)
        return int(p.ids[row, j])
