"""One definition of mean accepted length (engine.figures.mean_accepted_length, vLLM's: 1 + accepted ÷ drafts, a
draft being one sequence's step that verified drafted tokens): the window's figures, the server's timings and the
remote client's reading of a vLLM server's /metrics give the same number for the same counts."""

import pytest

from engine.decoding.stats import GenerationStats
from engine.figures import mean_accepted_length
from engine.remote import prometheus
from engine.serving.api_schema import timings


def counters(drafts: int, draft_tokens: int, accepted: int) -> prometheus.SpecCounters:
    return prometheus.SpecCounters.from_text(
        f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}\n'
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {draft_tokens}\n'
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}\n'
    )


@pytest.mark.parametrize(
    ("drafted", "accepted", "drafts", "plain_steps"), [(30, 21, 10, 15), (48, 48, 1, 0), (12, 0, 4, 3), (0, 0, 0, 9)]
)
def test_the_window_the_server_and_the_remote_client_agree(drafted, accepted, drafts, plain_steps):
    stats = GenerationStats(
        method="lookup",
        drafted=drafted,
        accepted=accepted,
        speculative_steps=drafts,
        verify_steps=drafts + plain_steps,
        generated=accepted + drafts + plain_steps,
    )
    window = stats.to_dict()["mean_acceptance_length"]
    server = timings(stats)["mean_acceptance_length"]
    moved = prometheus.delta(counters(100, 300, 150), counters(100 + drafts, 300 + drafted, 150 + accepted))
    remote = moved.mean_acceptance_length
    expected = mean_accepted_length(accepted, drafts)
    assert window == server == remote == expected
    if drafts:
        assert expected == pytest.approx(1 + accepted / drafts)  # plain steps do not count
    else:
        assert expected is None  # nothing drafted: n/a, as the acceptance rate


def test_it_is_vllms_definition_with_the_bonus_token():
    assert mean_accepted_length(21, 10) == pytest.approx(3.1)  # vLLM: 1 + num_accepted_tokens / num_drafts
    assert mean_accepted_length(0, 5) == 1.0  # every draft rejected: the bonus token alone
