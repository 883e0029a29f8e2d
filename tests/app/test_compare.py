"""The Compare view with the real embedded model (offscreen, temperature 0, prompt lookup): the same
prompt decoded plain and speculatively through the window's own engine, side by side, with measured
figures and a verdict; cancel mid-run leaves it usable; texts that part are named and shaded."""
from dataclasses import replace

from PySide6.QtCore import Qt

from conftest import PASSAGE  # noqa: E402 - tests/app/conftest.py

RUN_TIMEOUT_MS = 120_000
COUNTING = "Count from 1 to 500, separated by commas: " + ", ".join(str(i) for i in range(1, 31)) + ","


def open_compare(window, prompt):
    window.input.setPlainText(prompt)
    window.open_compare()
    return window._compare


def test_a_copied_passage_gives_the_same_answer_with_measured_figures_on_both_sides(
        make_window, qtbot, wait_response, gemma_settings):
    # Temperature 0, prompt lookup; a fixed draft length, so that drafts are verified whatever the shared
    # machine's timings make the adaptive length choose. Gemma: a base model copies the passage at length.
    window = make_window(replace(gemma_settings, adaptive=False))
    compare = open_compare(window, PASSAGE)
    assert compare.isVisible() and compare.prompt_edit.toPlainText() == PASSAGE
    assert f"prompt lookup, up to {gemma_settings.max_draft} draft tokens, fixed length" in compare.spec_pane.title()
    compare.max_tokens.setValue(60)
    shown = []  # tokens/s as each side showed it while streaming

    with qtbot.waitSignal(compare.comparisonFinished, timeout=RUN_TIMEOUT_MS) as done:
        qtbot.mouseClick(compare.run_button, Qt.MouseButton.LeftButton)
        assert compare.running and not compare.run_button.isEnabled() and compare.cancel_button.isEnabled()
        qtbot.waitUntil(lambda: shown.append(compare.spec_pane.speed.text()) or not compare.running,
                        timeout=RUN_TIMEOUT_MS)
    result = done.args[0]
    plain, spec = result["plain"], result["speculative"]

    assert result["same"] is True
    text = compare.plain_pane.text.toPlainText()
    assert "lighthouse at Point Arden" in text and text == compare.spec_pane.text.toPlainText()
    assert compare.verdict.isVisible() and compare.verdict.text().startswith("Same answer, ")
    assert "runs first" in compare.plain_pane.title() and "first" in compare.status.text()

    assert plain["method"] == "none" and plain["drafted"] == 0  # the plain run really was plain
    assert spec["method"] == "lookup" and spec["drafted"] > 0 and spec["accepted"] > 0
    assert plain["generated"] >= 10 and spec["generated"] == plain["generated"]  # the same answer, counted alike
    for pane, stats in ((compare.plain_pane, plain), (compare.spec_pane, spec)):
        assert stats["tokens_per_s"] > 0 and stats["ttft_s"] > 0
        assert pane.speed.text() == f"{stats['tokens_per_s']:.1f} tok/s"
        assert f"TTFT {stats['ttft_s']:.2f} s" in pane.figures.text()
        assert f"{stats['generated']} tokens" in pane.figures.text()
    figures = compare.spec_pane.figures.text()
    assert f"({spec['accepted']}/{spec['drafted']})" in figures
    assert f"{spec['mean_acceptance_length']:.2f} tok/step" in figures
    assert "prompt already processed" in figures  # the second run reused the first's prompt, and says so
    assert any(s.endswith("tok/s") for s in shown[:-1])  # figures were live while it streamed

    window.session.send(PASSAGE)  # the chat still speculates: the plain run was for that request only
    assert wait_response(window).stats["method"] == "lookup"


def test_cancel_mid_run_leaves_the_window_usable_and_the_order_alternates(make_window, qtbot, quick_settings):
    window = make_window(quick_settings)
    compare = open_compare(window, COUNTING)
    compare.max_tokens.setValue(400)
    with qtbot.waitSignal(compare.comparisonCancelled, timeout=RUN_TIMEOUT_MS):
        compare.run_button.click()
        qtbot.waitUntil(lambda: len(compare.plain_pane.segments) > 5, timeout=RUN_TIMEOUT_MS)
        qtbot.mouseClick(compare.cancel_button, Qt.MouseButton.LeftButton)
    assert not compare.running and compare.run_button.isEnabled() and not compare.cancel_button.isEnabled()
    assert compare.plain_pane.stats["finish_reason"] == "cancelled" and compare.plain_pane.stats["generated"] < 400
    assert compare.spec_pane.segments == []  # the second run was never sent
    assert not compare.verdict.isVisible() and "Cancelled" in compare.status.text()

    compare.prompt_edit.setPlainText(PASSAGE)
    compare.max_tokens.setValue(24)
    with qtbot.waitSignal(compare.comparisonFinished, timeout=RUN_TIMEOUT_MS) as done:
        compare.run_button.click()
    assert "runs first" in compare.spec_pane.title() and "runs second" in compare.plain_pane.title()
    assert done.args[0]["same"] is True and compare.verdict.text().startswith("Same answer")
    assert "prompt already processed" in compare.plain_pane.figures.text()
    assert compare.plain_pane.text.toPlainText() == compare.spec_pane.text.toPlainText() != ""


def test_texts_that_part_are_named_by_token_and_shaded(qtbot, dirs):
    """Greedy plain and speculative texts part only at near-ties, which cannot be caused on demand:
    the two sides are filled with texts that part at the third token, as the engine streams them."""
    from app.compare.window import CompareWindow, first_difference
    from app.settings.values import AppSettings
    from app.worker import EngineClient

    plain = [("The", False), (" lamp", False), (" was", False), (" lit", False)]
    spec = [("The", False), (" lamp", True), (" is", True), (" lit", False)]
    assert first_difference(plain, spec) == (2, 9)
    assert first_difference(plain, list(plain)) is None
    assert first_difference(plain, plain[:2]) == (2, 8)  # one text stops early: it parts where it ends

    engine = EngineClient()
    compare = CompareWindow(engine, lambda: AppSettings(temperature=0.0))
    qtbot.addWidget(compare)
    compare.show()
    # generated: counted as a run long enough to compare speeds (the texts are kept short to read)
    stats = {"tokens_per_s": 50.0, "ttft_s": 0.2, "generated": 100, "method": "none", "drafted": 0}
    for pane, segments, extra in ((compare.plain_pane, plain, {}),
                                  (compare.spec_pane, spec, {"tokens_per_s": 80.0, "method": "lookup", "drafted": 3,
                                                             "accepted": 2, "mean_acceptance_length": 1.67})):
        pane.reset(second=False)
        pane.add(segments)
        pane.show_stats({**stats, **extra})
    compare._conclude()
    assert compare.verdict.text().startswith("The texts differ from token 3: near-ties in the model's arithmetic")
    assert "1.6× faster" in compare.verdict.text() and "README" in compare.verdict.text()
    for pane in (compare.plain_pane, compare.spec_pane):
        (shaded,) = pane.text.extraSelections()
        assert shaded.cursor.selectedText() == pane.plain_text()[9:]  # from where they part to the end

    from app.compare.window import verdict
    compare.spec_pane.stats["mean_acceptance_length"] = 1.04  # drafting mostly paused: the speed-up is not its doing
    text, same = verdict(compare.plain_pane, compare.spec_pane, greedy=False, temperature=0.8)
    assert same is None and text.startswith("Sampled at temperature 0.8") and "1.6× faster" in text
    assert "gained little here (1.04 tokens per target step), so the difference in speed is mostly not its doing" in text
    compare.close()
    assert engine.shutdown()
