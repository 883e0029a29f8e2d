"""Compare claims a speed only from runs long enough to measure one: a short run (the real embedded model,
offscreen, through the window as a person uses it) shows the ratio and says it was too short to compare."""
from dataclasses import replace

from PySide6.QtCore import Qt

from conftest import PASSAGE  # noqa: E402 - tests/app/conftest.py

RUN_TIMEOUT_MS = 300_000  # the engine may first time its steps for speculation, on a busy machine


def test_a_short_run_shows_the_ratio_without_claiming_a_speed_up(make_window, qtbot, quick_settings):
    from app.compare.window import MIN_SPEED_TOKENS

    window = make_window(replace(quick_settings, adaptive=False))  # drafts every step: speculation is at work
    window.input.setPlainText(PASSAGE)
    window.open_compare()
    compare = window._compare
    compare.max_tokens.setValue(10)  # a 10-token answer, as the user's
    with qtbot.waitSignal(compare.comparisonFinished, timeout=RUN_TIMEOUT_MS) as done:
        qtbot.mouseClick(compare.run_button, Qt.MouseButton.LeftButton)
    result = done.args[0]
    plain, spec = result["plain"], result["speculative"]
    assert plain["generated"] == spec["generated"] == 10 < MIN_SPEED_TOKENS

    text = compare.verdict.text()
    assert compare.verdict.isVisible() and text.startswith("Same answer, ")
    ratio = spec["tokens_per_s"] / plain["tokens_per_s"]
    assert f"{ratio:.2f}× plain decoding's tokens/s over only 10 tokens" in text  # the ratio, as a figure
    assert "too short a run to compare speed" in text and f"{MIN_SPEED_TOKENS} or more" in text
    # and no verdict on speed, either way
    assert "× faster" not in text and "at the same speed" not in text and "plain decoding was faster" not in text


def test_the_speed_is_compared_from_the_minimum_on(qtbot, dirs):
    """Panes filled as the engine fills them: at MIN_SPEED_TOKENS tokens a side the speed-up is claimed,
    one token fewer on either side and it is not."""
    from app.compare.window import MIN_SPEED_TOKENS, CompareWindow, verdict
    from app.settings.values import AppSettings
    from app.worker import EngineClient

    engine = EngineClient()
    compare = CompareWindow(engine, lambda: AppSettings(temperature=0.0))
    qtbot.addWidget(compare)
    compare.show()
    segments = [("word", False)] * 4
    plain = {"tokens_per_s": 50.0, "ttft_s": 0.2, "method": "none", "drafted": 0}
    spec = {"tokens_per_s": 80.0, "ttft_s": 0.2, "method": "lookup", "drafted": 30, "accepted": 20,
            "mean_acceptance_length": 1.67}
    for plain_tokens, spec_tokens, claimed in ((MIN_SPEED_TOKENS, MIN_SPEED_TOKENS, True),
                                               (MIN_SPEED_TOKENS - 1, MIN_SPEED_TOKENS, False),
                                               (MIN_SPEED_TOKENS, MIN_SPEED_TOKENS - 1, False)):
        for pane, stats, tokens in ((compare.plain_pane, plain, plain_tokens), (compare.spec_pane, spec, spec_tokens)):
            pane.reset(second=False)
            pane.add(segments)
            pane.show_stats({**stats, "generated": tokens})
        text, _ = verdict(compare.plain_pane, compare.spec_pane, greedy=True, temperature=0.0)
        assert ("1.6× faster" in text) is claimed and ("too short a run to compare speed" in text) is not claimed
        assert "1.60× plain decoding's tokens/s" in text or claimed
    compare.close()
    assert engine.shutdown()
