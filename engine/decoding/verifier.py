"""Decides which drafted tokens the target keeps. Always returns at least one token.

Greedy: accept while the draft equals the target's argmax.
Sampling (p and q filtered identically), following Leviathan et al. 2023 / Chen et al. 2023:
- a draft model's token d: accept with probability min(1, p(d)/q(d)); on the first rejection sample
  from norm(max(0, p - q)) and stop; if every draft is accepted, sample the bonus token from p.
- a point-mass draft (prompt lookup, q = δ(d)): accept with probability p(d), else sample from p
  with d removed. This is done as a Gumbel-max draw from p with noise fixed by (seed, position):
  the drawn token is d with probability p(d), and otherwise follows p without d — the same rule —
  but the token at each position no longer depends on how many tokens were drafted, so a seed
  reproduces the text exactly even while the adaptive draft length follows measured timings.
Either way the output is distributed exactly as the target's own sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .sampling import Candidates, SamplingParams, draw, filter_logits, make_generator, position_seed


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
    """Greedy or sampled verification; randomness comes from torch generators seeded per position."""

    def __init__(self, params: SamplingParams, device: torch.device, seed: int):
        self.params = params
        self.device = device
        self.seed = seed
        self.generator = make_generator(seed, device)

    def verify(
        self, target_logits: np.ndarray, drafts: Sequence[int], draft_probs: Candidates | None, position: int
    ) -> Verdict:
        """position: index in the whole token sequence of the token that row 0 predicts.
        draft_probs: q for each drafted token (a draft model), or None for point-mass drafts."""
        if self.params.greedy:
            return verify_greedy(target_logits, drafts)
        p = filter_logits(torch.from_numpy(target_logits).to(self.device), self.params)
        if draft_probs is None:
            for i in range(len(drafts) + 1):
                token = self._gumbel_draw(p, i, position + i)
                if i == len(drafts) or token != drafts[i]:
                    return Verdict(i, token)
        assert draft_probs is not None  # the loop above returned at the latest at i == len(drafts)
        return self._rejection_sample(p, drafts, draft_probs, position, target_logits.shape[1])

    def _gumbel_draw(self, p: Candidates, row: int, position: int) -> int:
        """A sample from row's distribution: argmax of log p + Gumbel noise fixed by (seed, position, token)."""
        ids, probs = p.ids[row], p.probs[row]
        order = torch.argsort(ids)  # noise is tied to token ids, not to their rank in the candidates
        self.generator.manual_seed(position_seed(self.seed, position))
        uniform = torch.rand(len(ids), generator=self.generator, device=self.device, dtype=torch.float64)
        noise = torch.empty_like(uniform)
        noise[order] = -torch.log(-torch.log(uniform.clamp_min(1e-300)))
        score = torch.log(probs.double()) + noise  # log 0 = -inf: filtered-out tokens never win
        return int(ids[int(score.argmax())])

    def _rejection_sample(
        self, p: Candidates, drafts: Sequence[int], q: Candidates, position: int, vocab_size: int
    ) -> Verdict:
        k = len(drafts)
        self.generator.manual_seed(position_seed(self.seed, position))
        d = torch.tensor(drafts, dtype=torch.long, device=self.device)
        p_d, q_d = p.prob_of(d), q.prob_of(d)
        u = torch.rand(k, generator=self.generator, device=self.device)
        rejected = (u * q_d > p_d).nonzero()
        if len(rejected) == 0:
            return Verdict(k, p.sample(k, self.generator))
        i = int(rejected[0])
        q_on_support = q.dense_row(i, vocab_size)[p.ids[i]]
        residual = torch.clamp(p.probs[i] - q_on_support, min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: a rejection had ~0 probability
            residual = p.probs[i]
        return Verdict(i, int(p.ids[i, draw(residual, self.generator)]))
