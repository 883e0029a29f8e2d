"""The Compare view with the real embedded model (offscreen, temperature 0, prompt lookup), opened from the menu:
the same prompt decoded in pairs of runs, plain and speculative, the order alternating, at least three pairs; the
median speed-up and the range of the pairs' ratios in the verdict, each pair's figures in the table; cancel
mid-run leaves it usable."""

import statistics
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from support.window import PASSAGE, menu_actions

pytestmark = pytest.mark.slow  # compare runs on the real model

RUN_TIMEOUT_MS = 180_000
COUNTING = "Count from 1 to 500, separated by commas: " + ", ".join(str(i) for i in range(1, 31)) + ","
COMPARE = "Model → Compare plain vs speculation…"


def open_compare(window, prompt):
    window.input.setPlainText(prompt)
    dict(menu_actions(window))[COMPARE].trigger()
    return window.tools.compare


def test_pairs_alternate_and_the_verdict_gives_their_median_and_range(
    make_window, qtbot, wait_response, quick_settings
):
    from app.compare.pane import PAUSED_WORDS
    from app.compare.series import MIN_PAIRS

    # A fixed draft length, so that drafts are verified whatever the shared machine's timings make the
    # adaptive length choose.
    window = make_window(replace(quick_settings, adaptive=False))
    compare = open_compare(window, PASSAGE)
    assert compare.isVisible() and compare.prompt_edit.toPlainText() == PASSAGE
    assert f"prompt lookup, up to {quick_settings.max_draft} draft tokens, fixed length" in compare.spec_pane.title()
    compare.max_tokens.setValue(32)
    shown, live = [], []  # tokens/s as the speculative side showed it while streaming; the table meanwhile

    with qtbot.waitSignal(compare.comparisonFinished, timeout=RUN_TIMEOUT_MS) as done:
        qtbot.mouseClick(compare.run_button, Qt.MouseButton.LeftButton)
        assert compare.running and not compare.run_button.isEnabled() and compare.cancel_button.isEnabled()
        qtbot.waitUntil(
            lambda: (
                shown.append(compare.spec_pane.speed.text())
                or live.append(compare.pairs_table.rows())
                or not compare.running
            ),
            timeout=RUN_TIMEOUT_MS,
        )
    result = done.args[0]
    pairs = result["pairs"]

    assert len(pairs) >= MIN_PAIRS
    assert [p["first"] for p in pairs] == [("plain", "speculative")[i % 2] for i in range(len(pairs))]  # alternating
    for p in pairs:
        assert p["plain"]["method"] == "none" and p["plain"]["drafted"] == 0  # the plain runs really were plain
        assert p["speculative"]["method"] == "lookup" and p["speculative"]["drafted"] > 0
        assert p["ratio"] == p["speculative"]["tokens_per_s"] / p["plain"]["tokens_per_s"]
    ratios = [p["ratio"] for p in pairs]
    assert result["median"] == statistics.median(ratios)
    assert (result["low"], result["high"]) == (min(ratios), max(ratios))

    # every pair's figures in the table, as measured
    rows = compare.pairs_table.rows()
    assert len(rows) == len(pairs)
    for i, (row, p) in enumerate(zip(rows, pairs), 1):
        assert row[:5] == [
            str(i),
            p["first"],
            f"{p['plain']['tokens_per_s']:.1f}",
            f"{p['speculative']['tokens_per_s']:.1f}",
            f"{p['ratio']:.2f}×",
        ]
        assert row[6].endswith("%") or row[6] == "n/a"

    # the verdict: the median and the range, or "noisy" with the range; no engine estimate where none was given
    text = compare.verdict.text()
    assert compare.verdict.isVisible()
    if result["noisy"]:
        assert f"Noisy: {min(ratios):.2f}–{max(ratios):.2f}× over {len(pairs)} pairs" in text
        assert f"median {result['median']:.2f}×" in text
    else:
        assert f"measured {result['median']:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}×, {len(pairs)} pairs)" in text
    estimates = [p["speculative"].get("speedup_vs_plain") for p in pairs]
    estimates = [e for e in estimates if isinstance(e, (int, float))]
    if estimates:  # the engine's own estimate of the speed-up, beside the measured one
        assert f"engine estimated ≈{statistics.median(estimates):.2f}×" in text
    else:
        assert "estimated" not in text
    if result["same"]:
        assert text.startswith(f"Same answer in all {len(pairs)} pairs.")
        assert all(p["plain"]["generated"] == p["speculative"]["generated"] for p in pairs)  # counted alike
        assert compare.plain_pane.text.toPlainText() == compare.spec_pane.text.toPlainText() != ""
        assert all(row[5] == "same" for row in rows)
    else:  # greedy texts may part at near-ties: said, with where
        assert text.startswith("The texts differ in ") and any(row[5].startswith("part at token") for row in rows)

    # the panes show one pair's measured figures; "paused" only where the last step drafted nothing
    spec = result["speculative"]
    assert compare.spec_pane.speed.text() == f"{spec['tokens_per_s']:.1f} tok/s"
    assert f"({spec['accepted']}/{spec['drafted']})" in compare.spec_pane.figures.text()
    assert (PAUSED_WORDS in compare.spec_pane.figures.text()) is (
        bool(spec.get("speculation_paused")) and spec.get("draft_length") == 0
    )
    for pane, stats in ((compare.plain_pane, result["plain"]), (compare.spec_pane, spec)):  # said only where true
        assert ("prompt already processed" in pane.figures.text()) is (
            stats["reused_prompt_tokens"] == stats["prompt_tokens"] > 0
        )
    assert any(s.endswith("tok/s") for s in shown[:-1])  # figures were live while it streamed
    assert any("running…" in row[2:4] for rows in live for row in rows)  # and the table showed the pair under way

    window.session.send(PASSAGE)  # the chat still speculates: the plain runs were for those requests only
    assert wait_response(window).stats["method"] == "lookup"


def test_cancel_mid_run_leaves_the_window_usable(make_window, qtbot, quick_settings, monkeypatch):
    from app.compare import series

    monkeypatch.setattr(series, "MAX_PAIRS", series.MIN_PAIRS)  # the pairs are not what this test is about
    window = make_window(quick_settings)
    compare = open_compare(window, COUNTING)
    compare.max_tokens.setValue(400)
    with qtbot.waitSignal(compare.comparisonCancelled, timeout=RUN_TIMEOUT_MS):
        compare.run_button.click()
        qtbot.waitUntil(lambda: len(compare.plain_pane.segments) > 5, timeout=RUN_TIMEOUT_MS)
        qtbot.mouseClick(compare.cancel_button, Qt.MouseButton.LeftButton)
    assert not compare.running and compare.run_button.isEnabled() and not compare.cancel_button.isEnabled()
    assert compare.plain_pane.stats["finish_reason"] == "cancelled" and compare.plain_pane.stats["generated"] < 400
    assert compare.spec_pane.segments == []  # the next run was never sent
    assert not compare.verdict.isVisible() and "Cancelled after 0 complete pairs" in compare.status.text()

    compare.prompt_edit.setPlainText(PASSAGE)
    compare.max_tokens.setValue(16)
    with qtbot.waitSignal(compare.comparisonFinished, timeout=RUN_TIMEOUT_MS) as done:
        compare.run_button.click()
    assert len(done.args[0]["pairs"]) >= 3 and compare.verdict.isVisible()
    assert compare.plain_pane.plain_text() and compare.spec_pane.plain_text()
