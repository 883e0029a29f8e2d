"""The figures under a response: measured values formatted, n/a where missing, labelled memory."""

from app.chat.stats_view import StatsBar
from app.figure_texts import stat_items


def texts(stats):
    return {key: text for key, text, _ in stat_items(stats)}


def test_all_figures_shown():
    t = texts(
        {
            "tokens_per_s": 41.26,
            "ttft_s": 0.2049,
            "drafted": 40,
            "accepted": 30,
            "acceptance_rate": 0.75,
            "mean_acceptance_length": 2.5,
            "method": "draft",
            "memory_label": "VRAM 1.20 GiB",
            "backend": "CUDA",
            "finish_reason": "cancelled",
        }
    )
    assert t["speed"] == "41.3 tok/s"
    assert t["ttft"] == "TTFT 0.20 s"
    assert t["acceptance"] == "accepted 75% (30/40)"
    assert t["mean_length"] == "2.50 tok/step"
    assert t["method"] == "draft model"
    assert t["memory"] == "VRAM 1.20 GiB" and t["backend"] == "CUDA"
    assert t["finish"] == "stopped by you"


def test_unmeasured_figures_are_na():
    t = texts({"method": "lookup", "drafted": 0, "accepted": 0, "memory_kind": "RAM"})
    assert t["speed"] == "n/a tok/s" and t["ttft"] == "TTFT n/a"
    assert t["acceptance"] == "accepted n/a (0/0)"
    assert t["mean_length"] == "n/a tok/step"
    assert t["memory"] == "RAM n/a" and t["backend"] == "n/a"


def test_a_remote_answers_missing_ttft_reads_as_a_local_ones():
    t = texts({"remote": True, "tokens_per_s": None, "ttft_s": None})
    assert t["speed"] == "n/a tok/s incl. network" and t["ttft"] == "TTFT n/a incl. network"
    assert texts({"remote": True, "ttft_s": 0.5})["ttft"] == "TTFT 0.50 s incl. network"


def test_no_speculation_hides_acceptance_and_paused_is_said():
    t = texts({"method": "none", "tokens_per_s": 10.0})
    assert "acceptance" not in t and t["method"] == "no speculation"
    assert "paused" in texts({"method": "lookup", "speculation_paused": True})["method"]


def test_paused_is_worded_as_the_prediction_it_is():
    paused = {key: (text, tip) for key, text, tip in stat_items({"method": "lookup", "speculation_paused": True})}
    text, tip = paused["method"]
    assert text == "prompt lookup (paused: plain decoding predicted faster)"
    assert "predicted from the step times measured on this machine" in tip
    assert "paused" not in texts({"method": "lookup", "speculation_paused": False})["method"]


def test_stats_bar_shows_text_and_sparkline(qtbot):
    bar = StatsBar()
    qtbot.addWidget(bar)
    bar.set_stats({"tokens_per_s": 12.0, "method": "lookup", "rate_history": [[0.1, 5], [0.4, 9], [0.9, 12]]})
    bar.show()
    assert "12.0 tok/s" in bar.label.text()
    assert bar.sparkline.isVisible() and len(bar.sparkline.points) == 3
    bar.set_stats({"tokens_per_s": 12.0}, show_sparkline=False)
    assert not bar.sparkline.isVisible()


def test_tooltip_details():
    from app.figure_texts import detail_lines

    lines = detail_lines(
        {
            "generated": 40,
            "verify_steps": 12,
            "prompt_tokens": 300,
            "reused_prompt_tokens": 250,
            "per_position_acceptance": [0.9, 0.75, 0.5],
            "draft_time_share": 0.04,
            "method": "draft",
        }
    )
    assert lines == [
        "Generated 40 tokens in 12 target steps.",
        "Prompt: 300 tokens, 250 of them reused from the previous turn's cache.",
        "Acceptance by draft position: 90%, 75%, 50%.",
        "Time spent drafting: 4% of decoding.",
    ]
    assert detail_lines({}) == []


def test_every_figure_the_stats_line_reads_is_in_the_table():
    """A key read here and missing from engine.figures would be a figure nothing exports, checks or explains."""
    import ast
    from pathlib import Path

    import app.figure_texts as figure_texts
    from engine.figures import FIGURE

    read = set()
    for node in ast.walk(ast.parse(Path(figure_texts.__file__).read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "stats"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            read.add(node.args[0].value)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "stats"
            and isinstance(node.slice, ast.Constant)
        ):
            read.add(node.slice.value)
    assert len(read) > 15 and read - set(FIGURE) == set()


def test_each_answer_says_how_it_compares_with_plain_decoding_as_the_estimate_it_is():
    items = {key: (text, tip) for key, text, tip in stat_items({"method": "lookup", "speedup_vs_plain": 1.6234})}
    text, tip = items["vs_plain"]
    assert text == "≈1.62× plain"
    assert tip.startswith("An estimate") and "predicted from this machine's measured" in tip and "n/a where" in tip
    assert texts({"method": "none", "speedup_vs_plain": 0.987})["vs_plain"] == "≈0.99× plain"
    assert texts({"method": "lookup", "speedup_vs_plain": None})["vs_plain"] == "vs plain n/a"
    assert texts({"method": "lookup"})["vs_plain"] == "vs plain n/a"  # an answer saved before it was estimated
    assert texts({"remote": True})["vs_plain"] == "vs plain n/a"  # a server's plain speed is not measured here


def test_auto_with_a_built_in_or_head_drafter_names_it_and_no_draft_model_it_does_not_have():
    """Auto on a model with MTP layers (no draft model) and auto with an EAGLE-3 head: each drafter by its own name."""
    mtp = {
        "method": "auto",
        "by_proposer": {"lookup": {"drafted": 4, "accepted": 2}, "mtp": {"drafted": 30, "accepted": 27}},
    }
    assert texts(mtp)["by_proposer"] == "lookup 2/4 · MTP 27/30"
    head = {
        "method": "auto",
        "by_proposer": {"lookup": {"drafted": 0, "accepted": 0}, "eagle3": {"drafted": 9, "accepted": 9}},
    }
    assert texts(head)["by_proposer"] == "lookup 0/0 (proposed nothing) · EAGLE-3 9/9"
    from app.figure_texts import detail_lines

    assert detail_lines(head)[-1] == "The EAGLE-3 draft head: drafted 9 tokens, 9 kept (100%)."  # saved without steps
    head["by_proposer"]["eagle3"]["steps"] = 3
    assert detail_lines(head)[-1] == "The EAGLE-3 draft head: drafted 9 tokens, 9 kept (100%), 4.00 tokens a step."


def test_the_guards_words_are_on_the_line_when_it_backed_off():
    t = texts({"method": "lookup", "guard": "backed off: ran at 0.91× plain"})
    assert t["guard"] == "backed off: ran at 0.91× plain"
    assert "guard" not in texts({"method": "lookup", "guard": None})


def test_auto_says_who_did_the_work_and_a_draft_that_proposed_nothing_says_so():
    auto = {
        "method": "auto",
        "by_proposer": {"draft": {"drafted": 0, "accepted": 0}, "lookup": {"drafted": 90, "accepted": 69}},
    }
    assert texts(auto)["by_proposer"] == "lookup 69/90 · draft 0/0 (proposed nothing)"
    auto["by_proposer"]["draft"] = {"drafted": 26, "accepted": 0}
    assert texts(auto)["by_proposer"] == "lookup 69/90 · draft 0/26 (none kept)"
    assert "by_proposer" not in texts({"method": "lookup", "by_proposer": {"lookup": {"drafted": 9, "accepted": 3}}})
    assert texts({"method": "auto"})["by_proposer"] == "by proposer n/a"  # saved before it was counted
    assert (
        texts({"method": "auto", "by_proposer": {}})["by_proposer"]
        == "lookup 0/0 (proposed nothing) · draft 0/0 (proposed nothing)"
    )  # counted, and neither drafted
    from app.figure_texts import detail_lines

    assert detail_lines(auto)[-2:] == [
        "Prompt lookup: drafted 90 tokens, 69 kept (77%).",
        "The draft model: drafted 26 tokens, 0 kept (0%).",
    ]
