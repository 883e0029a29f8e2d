"""The lab window with the real embedded model (offscreen): a tiny run fills the chart and table and
ends in advice that can be applied; cancel stops it; results survive a save and a load."""

import json

import pytest

from support.window import collect_garbage_now

pytestmark = pytest.mark.slow  # lab runs on the real model

RUN_TIMEOUT_MS = 180_000


COPY = "Colours: red, green, blue, yellow, purple, orange, white.\nThe same colours again: red, green,"
OPEN = "The best way to spend three days in Kyoto is"


@pytest.fixture
def tiny_prompts(tmp_path):
    path = tmp_path / "tiny.jsonl"  # short prompts: the run is about decoding, not prefill
    path.write_text(
        json.dumps({"id": "copy", "prompt": COPY}) + "\n" + json.dumps({"id": "open", "prompt": OPEN}) + "\n"
    )
    return path


@pytest.fixture
def lab(qtbot, gemma_path, tiny_prompts):
    from app.lab.window import CUSTOM, LabWindow

    window = LabWindow()
    qtbot.addWidget(window)
    window.prompt_combo.setCurrentIndex(window.prompt_combo.findData(CUSTOM))
    window.prompt_file.setText(str(tiny_prompts))
    for level, box in window.level_boxes.items():
        box.setChecked(level in (1, 2))
    window.max_tokens.setValue(8)
    window.max_draft.setValue(4)
    window.adaptive.setChecked(False)  # lookup drafts every step, so acceptance is measured
    window.threads.setValue(2)
    window.show()
    yield window
    window.shutdown()
    collect_garbage_now()


def test_a_run_fills_the_chart_and_table_and_ends_in_advice(lab, qtbot, tmp_path):
    seen = []
    lab.progress.valueChanged.connect(seen.append)  # on the GUI thread, as the window sees progress
    assert not lab.progress.isVisible()  # at rest an empty bar looked like a text box
    with qtbot.waitSignal(lab.runFinished, timeout=RUN_TIMEOUT_MS) as done:
        lab.run_button.click()
        assert lab.running and not lab.run_button.isEnabled() and lab.cancel_button.isEnabled()
        assert lab.progress.isVisible()
    results = done.args[0]
    assert lab.progress.value() == 100 and not lab.running and lab.run_button.isEnabled()
    assert not lab.progress.isVisible()
    assert len(seen) >= 3 and seen == sorted(seen) and seen[-1] == 100
    assert lab.table.rowCount() == 4
    for chart in (lab.rate_chart, lab.itl_chart):
        assert [x for x, _ in chart.points("none")] == [1, 2] and [x for x, _ in chart.points("lookup")] == [1, 2]
        assert all(y > 0 for _, y in chart.points("lookup"))
    rates = {(c["method"], c["concurrency"]): c["full_tokens_per_s"] for c in results["cells"]}  # every slot busy
    assert lab.rate_chart.points("lookup")[1][1] == pytest.approx(rates[("lookup", 2)])
    levels = sorted(lab.table.item(row, 1).text() for row in range(lab.table.rowCount()))
    assert levels[0] == levels[1] == "1\n1.0 avg" and all(t.startswith("2\n") for t in levels[2:])  # in flight
    assert "prompt lookup" in lab.advice.text()
    assert "Recommended for the chat" in lab.advice.text() or "nothing to recommend" in lab.advice.text()

    # The chat runs this model with speculation off and the lab's drafting: Apply sends the method alone, if any.
    lab.set_chat_models("embedded", None, "none", 4, False)
    recommended = results["advice"]["settings"].get("method")
    if recommended == "lookup":
        with qtbot.waitSignal(lab.applySettings) as applied:
            lab.apply_button.click()
        assert applied.args[0] == {"method": "lookup"}
    else:  # plain decoding is what the chat runs already, or the run could not tell
        assert not lab.apply_button.isEnabled() and lab.apply_note.text()

    saved = tmp_path / "saved.json"
    lab.save_results(saved)
    from app.lab.window import LabWindow

    other = LabWindow()
    qtbot.addWidget(other)
    other.load_results(saved)
    assert other.table.rowCount() == 4
    assert other.rate_chart.points("lookup") == lab.rate_chart.points("lookup")
    assert other.advice.text() == lab.advice.text()
    assert not other.apply_button.isEnabled()
    if recommended:  # something to apply, but not for models it was not told of
        assert "does not know the chat's models" in other.apply_note.text()
    other.shutdown()


def test_cancel_stops_the_run_and_keeps_nothing(lab, qtbot):
    lab.max_tokens.setValue(400)
    lab.progress.valueChanged.connect(lambda value: lab.cancel_run() if value > 0 else None)
    with qtbot.waitSignal(lab.runCancelled, timeout=RUN_TIMEOUT_MS):
        lab.run_button.click()
    assert not lab.running and lab.run_button.isEnabled() and not lab.cancel_button.isEnabled()
    assert lab.results is None and not lab.apply_button.isEnabled()
    assert lab.progress.value() < 50


def test_unreadable_results_are_refused(lab, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "lab results"}')
    with pytest.raises(ValueError, match="no lab results"):
        lab.load_results(bad)
    assert lab.results is None


def test_a_draft_model_offers_auto_and_a_run_measures_it(lab, qtbot, gemma_path):
    """The methods that need a draft come with one: typed in, auto (the chat's default with a draft) is ticked and
    the draft model alone may be; a run then measures auto beside the rest, and clearing the draft takes both away."""
    boxes = lab.method_boxes
    assert not boxes["auto"].isEnabled() and not boxes["draft"].isEnabled()
    lab.model_edit.setEditText(str(gemma_path))
    lab.draft_edit.setText(str(gemma_path))  # the model drafting for itself: small, and the run is about the window
    assert boxes["auto"].isChecked() and boxes["draft"].isEnabled() and not boxes["draft"].isChecked()
    for level, box in lab.level_boxes.items():
        box.setChecked(level == 1)
    with qtbot.waitSignal(lab.runFinished, timeout=RUN_TIMEOUT_MS) as done:
        lab.run_button.click()
    assert {c["method"] for c in done.args[0]["cells"]} == {"none", "lookup", "auto"}
    assert [x for x, _ in lab.rate_chart.points("auto")] == [1] and lab.table.rowCount() == 3
    lab.draft_edit.setText("")
    assert not boxes["auto"].isChecked() and not boxes["auto"].isEnabled()


def test_a_cancelled_run_leaves_the_earlier_results_in_place(lab, qtbot):
    for level, box in lab.level_boxes.items():
        box.setChecked(level == 1)
    with qtbot.waitSignal(lab.runFinished, timeout=RUN_TIMEOUT_MS):
        lab.run_button.click()
    earlier, rows = lab.results, lab.table.rowCount()
    advice, points = lab.advice.text(), lab.rate_chart.points("lookup")
    assert rows == 2 and advice

    lab.max_tokens.setValue(400)
    cancel = lambda value: lab.cancel_run() if value > 0 else None  # noqa: E731
    lab.progress.valueChanged.connect(cancel)
    with qtbot.waitSignal(lab.runCancelled, timeout=RUN_TIMEOUT_MS):
        lab.run_button.click()
    lab.progress.valueChanged.disconnect(cancel)
    assert lab.results is earlier and lab.table.rowCount() == rows and lab.advice.text() == advice
    assert lab.rate_chart.points("lookup") == points
    assert "earlier results are shown again" in lab.status.text() and lab.save_button.isEnabled()


def test_the_lab_runs_the_chats_models_and_its_verdict_names_them(lab, qtbot, gemma_path):
    """The chat window passes its models (set_chat_models): the form starts on them, the run measures them, the
    verdict names them, and Apply is not refused for measuring other models."""
    lab.set_chat_models(str(gemma_path), None, "lookup", 4, False)
    assert lab.model_edit.currentText() == str(gemma_path) and lab.max_draft.value() == 4
    for level, box in lab.level_boxes.items():
        box.setChecked(level == 1)
    with qtbot.waitSignal(lab.runFinished, timeout=RUN_TIMEOUT_MS) as done:
        lab.run_button.click()
    results = done.args[0]
    assert results["env"]["model"] == str(gemma_path) and results["settings"]["max_draft"] == 4
    verdict = lab.advice.text()
    assert f"Measured: {results['env']['model_name']}, on this machine" in verdict
    assert "by per-request tok/s" in verdict and "Small sample" in verdict  # 16 tokens a cell, one run
    assert "Apply is off" not in lab.apply_note.text() and lab.apply_note.text()
