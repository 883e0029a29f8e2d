"""SpecChat's --method mtp beside llama-server's --spec-type draft-mtp (engine/measure/mtp_versus_server.py): the
report's arithmetic, and (where SPECCHAT_LLAMA_SERVER names a llama-server binary) both sides' counts on the
synthetic MTP files, which the pinned llama.cpp's server drafts by the same rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.measure import mtp_versus_server as mvs
from engine.measure import synthetic

SERVER = os.environ.get("SPECCHAT_LLAMA_SERVER")


def row(ours: tuple[int, int], theirs: tuple[int, int]) -> dict:
    return {
        "model": "/x/m.gguf",
        "prompts": 2,
        "specchat": {"drafted": ours[0], "accepted": ours[1], "same_answers": 2},
        "llama_server": {"drafted": theirs[0], "accepted": theirs[1], "same_answers": 2},
    }


def test_counts_are_compared_relative_to_the_servers_within_five_percent():
    assert mvs.apart(105, 100) == pytest.approx(0.05)
    assert mvs.apart(0, 0) == 0.0 and mvs.apart(3, 0) == 1.0
    assert mvs.within_tolerance([row((105, 50), (100, 50))])
    assert not mvs.within_tolerance([row((100, 53), (100, 50))])  # kept 6% apart
    assert "| m.gguf | 2 | 100 / 53 | 100 / 50 | 0.0% | 6.0% | 2/2 |" in mvs.table([row((100, 53), (100, 50))])


@pytest.mark.skipif(not (SERVER and Path(SERVER).exists()), reason="set SPECCHAT_LLAMA_SERVER to a llama-server binary")
@pytest.mark.parametrize("name", ["mtp-half", "mtp-half-context"])
def test_specchat_drafts_and_keeps_what_llama_servers_draft_mtp_does(tmp_path, name):
    """Fixed drafts of 3, greedy: the same answer and the same counts, drafts rejected at most steps."""
    assert SERVER is not None
    model = str(synthetic.write_all(tmp_path, [name])[name])
    result = mvs.compare(SERVER, model, list(mvs.PROMPTS[:2]), max_tokens=48, draft=3, threads=1)
    ours, theirs = result["specchat"], result["llama_server"]
    assert ours == theirs, result
    assert ours["same_answers"] == 2
    assert 0 < ours["accepted"] < ours["drafted"] / 2
