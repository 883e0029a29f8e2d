"""Rejection sampling keeps the target's distribution exactly, with a draft model's q rows of different
widths stacked (padded) together and top-p-only filtering, checked by a chi-square test on many draws."""

import pytest
import torch

from engine.decoding.proposers.draft_model import stack_candidates
from engine.decoding.sampling import SamplingParams, filter_logits
from engine.decoding.verifier import Verifier

from support.distributions import chi_square_p_value

pytestmark = pytest.mark.slow  # a chi-square test on many draws

VOCAB = 4096
TOP_P_ONLY = SamplingParams(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0, seed=1)
DRAWS = 20_000


def test_first_token_follows_the_target_with_padded_draft_rows():
    gen = torch.Generator().manual_seed(0)
    # Target: token 0 is likely but less so than the draft thinks, so the residual max(0, p - q) is 0 there.
    target_logits = torch.randn(3, VOCAB, generator=gen)
    target_logits[:, 0] += 7.0
    target_logits[:, 1:6] += 6.0
    # Draft slot 0 is peaked (its top-p candidates fit in the first 1,024), slot 1 is flat (needs them all):
    # stacked, slot 0's row is padded with 3,072 entries of token id 0 and probability 0.
    peaked = torch.randn(1, VOCAB, generator=gen)
    peaked[0, 0] += 12.0
    peaked[0, 1:3] += 10.0
    flat = torch.randn(1, VOCAB, generator=gen) * 0.1
    q_rows = [filter_logits(peaked, TOP_P_ONLY), filter_logits(flat, TOP_P_ONLY)]
    assert q_rows[0].ids.shape[1] < q_rows[1].ids.shape[1]  # the padding this test is about
    q = stack_candidates(q_rows)
    p = filter_logits(target_logits, TOP_P_ONLY)
    expected = torch.zeros(VOCAB, dtype=torch.float64).scatter_add_(0, p.ids[0], p.probs[0].double()) * DRAWS

    verifier = Verifier(TOP_P_ONLY, torch.device("cpu"), seed=7)
    drafts = torch.stack([torch.multinomial(q.probs[i], DRAWS, replacement=True, generator=gen) for i in range(2)])
    draft_ids = torch.stack([q.ids[i][drafts[i]] for i in range(2)])
    observed = torch.zeros(VOCAB, dtype=torch.float64)
    for n in range(DRAWS):
        tokens = [int(draft_ids[0, n]), int(draft_ids[1, n])]
        verdict = verifier._rejection_sample(p, tokens, q, position=n * 4, vocab_size=VOCAB)
        first = tokens[0] if verdict.accepted >= 1 else verdict.next_token
        observed[first] += 1
    assert expected[0] / DRAWS > 0.03  # token 0, where the padding sits, carries real mass under p
    p_value = chi_square_p_value(observed, expected)
    assert p_value > 1e-3, (
        f"the first token does not follow p (chi-square p = {p_value:.2e}); token 0: "
        f"{int(observed[0])} drawn, {expected[0]:.0f} expected"
    )
