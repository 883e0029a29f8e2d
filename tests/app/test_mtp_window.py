"""The built-in drafter (MTP) through the window, on the synthetic qwen35 files (engine/measure/synthetic.py): a
model with an MTP head drafts from it and the answer's stats say so; a model without one still loads and answers,
with a notice saying why nothing drafts; choosing MTP reloads the model with its MTP layers. Step and draft costs
are pinned (as in tests/engine/test_mtp_proposer.py) so whether the head drafts follows acceptance, not this
machine's load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.measure import synthetic

from support.step_costs import ONE_ROW_S, pin_draft_costs, pin_step_costs

STEP_COST = {1: 1.0, 2: 1.1, 9: 1.8, 17: 2.6}  # a GPU-like target: a verified row costs a tenth of a step


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory):
    return str(synthetic.write_all(tmp_path_factory.mktemp("mtp-window"))["mtp-agreeing"])


@pytest.fixture
def pinned(monkeypatch):
    pin_step_costs(monkeypatch, STEP_COST)
    pin_draft_costs(monkeypatch, ONE_ROW_S / 10, ONE_ROW_S / 50)


def send(window, qtbot, wait_response, text="Hello there, how are you?"):
    window.input.setPlainText(text)
    window.send_message()
    answer = wait_response(window)
    assert answer.status == "done", answer.notice
    return answer


def test_a_model_with_an_mtp_head_drafts_from_it_and_the_stats_say_so(
    make_window, qtbot, wait_response, quick_settings, agreeing, pinned
):
    window = make_window(replace(quick_settings, model=agreeing, method="mtp", max_tokens=32))
    assert window.engine.worker.decoder.target.settings.mtp  # loaded with its MTP layers
    answer = send(window, qtbot, wait_response)
    stats = answer.stats
    assert stats["drafted"] > 0 and stats["accepted"] / stats["drafted"] >= 0.9, stats
    assert stats["by_proposer"] == {
        "mtp": {"drafted": stats["drafted"], "accepted": stats["accepted"], "steps": stats["speculative_steps"]}
    }, stats
    bar = window.view.widget_for(len(window.session.model.items) - 1).stats
    shown, tip = bar.text(), bar.label.toolTip()
    assert "built-in drafter (MTP)" in shown, shown
    assert f"The built-in drafter (MTP): drafted {stats['drafted']} tokens" in tip, tip
    assert "draft model" not in shown.lower() and "draft model" not in tip.lower(), (shown, tip)
    assert not any("Speculation is off" in t for t in window.notices.texts())


def test_mtp_on_a_model_without_a_head_keeps_the_model_and_says_why(make_window, qtbot, wait_response, quick_settings):
    window = make_window(replace(quick_settings, method="mtp"))  # the embedded SmolLM2: no MTP layers
    notices = window.notices.texts()
    assert any("Speculation is off" in t and "no MTP (nextn) layers" in t for t in notices), notices
    answer = send(window, qtbot, wait_response, "What is the capital of France?")
    assert answer.content and answer.stats.get("drafted", 0) == 0


def test_choosing_mtp_reloads_the_model_with_its_mtp_layers_and_leaving_it_reloads_without(
    make_window, qtbot, quick_settings, agreeing
):
    settings = replace(quick_settings, model=agreeing, method="lookup")
    window = make_window(settings)
    assert not window.engine.worker.decoder.target.settings.mtp
    for method, loaded_with_mtp in (("mtp", True), ("lookup", False)):
        with qtbot.waitSignal(window.modelLoaded, timeout=120_000):
            window.models.apply_settings(replace(window.settings, method=method))
        assert window.engine.worker.decoder.target.settings.mtp is loaded_with_mtp
