"""The verifier alone, with known p and q: its output must follow the target's distribution."""

import numpy as np
import pytest
import torch

from engine.decoding.sampling import SamplingParams, filter_logits, make_generator
from engine.decoding.verifier import Verdict, Verifier, verify_greedy
from engine.errors import InvalidSettingError

CHI2_999 = {2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}  # chi-square 0.999 quantiles by degrees of freedom
TARGET = np.array([[2.0, 1.5, 0.5, 0.0, -1.0, -3.0], [0.0, 1.0, 2.0, 0.5, 0.0, 0.0]], dtype=np.float32)
DRAFT = np.array([[0.5, 2.5, 0.0, 1.0, -1.0, 0.0]], dtype=np.float32)  # deliberately unlike p


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token outside the target's support was emitted"
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum() - 1)


def first_token_counts(params: SamplingParams, draft_kind: str, trials: int = 20000) -> np.ndarray:
    device = torch.device("cpu")
    gen = make_generator(99, device)
    verifier = Verifier(params, device, seed=1234)
    q = filter_logits(torch.from_numpy(DRAFT), params)
    counts = np.zeros(TARGET.shape[1], dtype=np.int64)
    guesses = q.ids[0][torch.multinomial(q.probs[0], trials, replacement=True, generator=gen)].tolist()  # d ~ q
    for trial in range(trials):  # each trial stands for a different position in a sequence
        if draft_kind == "model":
            d = guesses[trial]
            verdict = verifier.verify(TARGET, [d], q, position=trial)
        else:  # lookup: a fixed point-mass guess
            d = 1
            verdict = verifier.verify(TARGET, [d], None, position=trial)
        counts[d if verdict.accepted else verdict.next_token] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("draft_kind", ["model", "lookup"])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
        SamplingParams(temperature=0.7, top_k=4, top_p=0.9, min_p=0.05),
    ],
)
def test_speculative_sampling_matches_target_distribution(params, draft_kind):
    counts = first_token_counts(params, draft_kind)
    p = filter_logits(torch.from_numpy(TARGET[:1]), params)
    dense = p.dense_row(0, TARGET.shape[1]).numpy()
    stat, df = chi_square(counts, dense)
    assert stat < CHI2_999[df], (counts, dense)


def test_a_biased_verifier_would_fail_the_same_check():
    """The check has teeth: always accepting the draft's token gives q's distribution, and is caught."""
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    gen = make_generator(7, torch.device("cpu"))
    q = filter_logits(torch.from_numpy(DRAFT), params)
    counts = np.zeros(6, dtype=np.int64)
    for _ in range(20000):
        counts[q.sample(0, gen)] += 1
    p = filter_logits(torch.from_numpy(TARGET[:1]), params).dense_row(0, 6).numpy()
    assert chi_square(counts, p)[0] > CHI2_999[5]


def test_greedy_accepts_the_argmax_prefix_and_corrects_the_rest():
    logits = np.zeros((4, 10), dtype=np.float32)
    logits[0, 3] = logits[1, 7] = logits[2, 2] = logits[3, 9] = 5.0
    v = verify_greedy(logits, [3, 7, 1])
    assert (v.accepted, v.next_token) == (2, 2)
    v = verify_greedy(logits, [3, 7, 2])
    assert (v.accepted, v.next_token) == (3, 9)  # all kept, plus the bonus token
    v = verify_greedy(logits, [4, 7, 2])
    assert (v.accepted, v.next_token) == (0, 3)


def test_point_mass_verdicts_do_not_depend_on_the_draft_length():
    """Lookup's token at a position is fixed by (seed, position), however many tokens were drafted."""
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    verifier = Verifier(params, torch.device("cpu"), seed=5)
    for position in range(200):
        plain = verifier.verify(TARGET[:1], [], None, position).next_token
        drafted = verifier.verify(TARGET, [plain], None, position)
        assert drafted.accepted == 1  # a draft equal to the plain sample is always kept
        wrong = (plain + 1) % 6
        assert verifier.verify(TARGET, [wrong], None, position) == Verdict(0, plain)


@pytest.mark.parametrize(
    "kwargs", [dict(temperature=-1), dict(top_p=0.0), dict(top_k=-2), dict(min_p=1.0), dict(seed="x")]
)
def test_out_of_range_sampling_values_are_refused(kwargs):
    with pytest.raises(InvalidSettingError):
        SamplingParams(**kwargs)


def test_filters_follow_llama_cpp_order():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -10.0]])
    c = filter_logits(logits, SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0))
    assert sorted(c.ids[0][c.probs[0] > 0].tolist()) == [0, 1, 2]
    c = filter_logits(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0))
    assert sorted(c.ids[0][c.probs[0] > 0].tolist()) == [0, 1]  # 0.64 < 0.7, so the second is kept
    c = filter_logits(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3))
    assert sorted(c.ids[0][c.probs[0] > 0].tolist()) == [0, 1]  # e^-1 ≈ 0.37 ≥ 0.3, e^-2 < 0.3
    assert torch.allclose(c.probs.sum(dim=1), torch.ones(1))
