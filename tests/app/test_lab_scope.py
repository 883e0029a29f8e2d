"""The lab's advice is scoped to what it measured (offscreen, through the lab window): Apply is offered only for
results of the chat's own models and sends only what the lab measured that the chat does differently; plain
decoding turns speculation off without touching the chosen method; the verdict names the models and the measure
it rests on, quotes the table's own ratios, and calls a small sample a hint. Results are loaded as "Load results…"
loads them, so no model has to run; one test goes through the chat window's menu and its settings."""

import json

import pytest

from engine.lab.compare import compare
from engine.modelfiles.embedded import DISPLAY_NAMES, EMBEDDED

from support.window import collect_garbage_now

QWEN = "/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_DRAFT = "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def cell(method, concurrency, full, per_request, itl, tokens=192):
    return {
        "method": method,
        "concurrency": concurrency,
        "requests": 2,
        "generated_tokens": tokens,
        "wall_s": tokens / full,
        "full_tokens_per_s": full,
        "aggregate_tokens_per_s": 0.9 * full,
        "per_request_tokens_per_s": per_request,
        "itl_p50_ms": itl,
        "itl_p95_ms": 2 * itl,
        "e2e_p50_s": 5.0,
        "e2e_p95_s": 6.0,
        "drafted": 0 if method == "none" else 100,
        "accepted": 0 if method == "none" else 40,
        "verify_steps": 0 if method == "none" else 60,
        "acceptance_rate": None if method == "none" else 0.4,
        "mean_acceptance_length": None if method == "none" else 1.67,
        "per_position_acceptance": [],
        "repeats": 1,
    }


def document(model, cells, draft=None, methods=("none", "lookup"), max_draft=8, adaptive=True, name="SmolLM2"):
    return {
        "schema": "specchat-lab/1",
        "created": "",
        "settings": {
            "prompts": "grounded.jsonl",
            "prompt_set": "grounded",
            "model": model,
            "draft": draft,
            "methods": list(methods),
            "concurrency": [1],
            "max_tokens": 96,
            "max_draft": max_draft,
            "adaptive": adaptive,
            "temperature": 0.0,
            "repeats": 1,
        },
        "env": {"backend": "CPU", "threads": 2, "model": model, "model_name": name, "draft": draft},
        "cells": cells,
    }


def lookup_pays(model="embedded", **kw):  # lookup 1.5× plain by every measure
    return document(model, [cell("none", 1, 40.0, 40.0, 25.0), cell("lookup", 1, 60.0, 60.0, 16.0)], **kw)


def plain_wins(model="embedded", **kw):  # lookup 0.7× plain by every measure
    return document(model, [cell("none", 1, 40.0, 40.0, 25.0), cell("lookup", 1, 28.0, 28.0, 36.0)], **kw)


@pytest.fixture
def lab(qtbot):
    from app.lab.window import LabWindow

    window = LabWindow()
    qtbot.addWidget(window)
    window.show()
    yield window
    window.shutdown()
    collect_garbage_now()


def load(lab, tmp_path, doc):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    lab.load_results(path)


def test_apply_is_not_offered_for_results_of_other_models_than_the_chats(lab, tmp_path):
    """What a user saw: the lab measured SmolLM2 while the chat ran the Qwen pair, and Apply changed the pair."""
    lab.set_chat_models(QWEN, QWEN_DRAFT, "auto", 48, True)
    load(lab, tmp_path, plain_wins("embedded"))
    assert not lab.apply_button.isEnabled()
    assert "the lab measured SmolLM2" in lab.apply_note.text()
    assert "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" in lab.apply_note.text()

    load(lab, tmp_path, plain_wins(QWEN, name="Qwen2.5 Coder 1.5B"))  # the target, but not the chat's draft
    assert not lab.apply_button.isEnabled() and "drafts with qwen2.5-coder-0.5b" in lab.apply_note.text()

    # the pair, but not the chat's method: whether lookup beats auto was not measured
    load(lab, tmp_path, plain_wins(QWEN, draft=QWEN_DRAFT, name="Qwen2.5 Coder 1.5B"))
    assert not lab.apply_button.isEnabled() and "did not measure the chat's method" in lab.apply_note.text()


def test_the_form_starts_on_the_chats_models(lab):
    lab.set_chat_models(QWEN, QWEN_DRAFT, "auto", 32, False)
    config = lab.config()
    assert (config.model, config.draft, config.max_draft, config.adaptive) == (QWEN, QWEN_DRAFT, 32, False)
    assert {"none", "auto"} <= set(config.methods)
    assert lab.model_edit.currentText() == QWEN and lab.draft_edit.text() == QWEN_DRAFT


def test_plain_decoding_turns_speculation_off_and_keeps_the_chats_method(make_window, qtbot, tmp_path, quick_settings):
    """Model → Speculation lab…, results of the chat's own model where plain decoding wins: Apply turns speculation
    off and nothing else, so turning it back on finds the method the user chose."""
    from support.window import menu_actions

    window = make_window(quick_settings)
    dict(menu_actions(window))["Model → Speculation lab…"].trigger()
    lab = window.tools.lab
    s = window.settings
    lab.set_chat_models(s.model, s.draft, s.effective_method, s.max_draft, s.adaptive)  # as main_window will
    assert (s.method, s.speculation) == ("lookup", True)
    load(lab, tmp_path, plain_wins("embedded", max_draft=8))
    assert lab.apply_button.isEnabled() and "speculation on → off; nothing else" in lab.apply_note.text()
    with qtbot.waitSignal(lab.applySettings) as applied:
        lab.apply_button.click()
    assert applied.args[0] == {"speculation": False}  # not method "none", not the lab's max draft of 8
    assert window.settings.speculation is False and window.settings.method == "lookup"
    assert window.settings.max_draft == s.max_draft
    lab.close()


def test_a_new_method_comes_with_the_drafting_it_was_measured_with_and_nothing_else(lab, qtbot, tmp_path):
    lab.set_chat_models("embedded", None, "none", 48, True)  # speculation off in the chat
    load(lab, tmp_path, lookup_pays(max_draft=8))
    assert "method Off → Prompt lookup, max draft 48 → 8" in lab.apply_note.text()
    with qtbot.waitSignal(lab.applySettings) as applied:
        lab.apply_button.click()
    assert applied.args[0] == {"method": "lookup", "max_draft": 8}  # adaptive was the chat's already

    # the chat already runs lookup: the lab compared methods, not caps, so it has nothing to change
    lab.set_chat_models("embedded", None, "lookup", 48, True)
    assert not lab.apply_button.isEnabled() and "already runs" in lab.apply_note.text()


def test_the_verdict_names_its_measure_and_quotes_the_tables_own_ratios(lab, tmp_path):
    """What a user saw: "prompt lookup did not pay even at 1 concurrent chat (0.83×…)" above a table where lookup was
    ahead per request (41.5 vs 40.7 tok/s) and on latency (20.3 vs 23.8 ms); 192 tokens a cell, one run."""
    doc = document(
        "embedded",
        [cell("none", 1, 50.0, 40.7, 23.8), cell("lookup", 1, 41.5, 41.5, 20.3)],
        name="SmolLM2-135M-Instruct",
    )
    load(lab, tmp_path, doc)
    verdict = lab.advice.text()
    assert f"Measured: {DISPLAY_NAMES[EMBEDDED]}, on this machine" in verdict  # the model it rests on, by name
    found = compare(lab.results)[("lookup", 1)]
    row = next(r for r in range(lab.table.rowCount()) if lab.table.item(r, 0).text() == "prompt lookup")
    shown = [lab.table.item(row, c).text() for c in range(lab.table.columnCount())]
    for measure, words in (
        ("per_request", "by per-request tok/s"),
        ("throughput", "By throughput at full load"),
        ("latency", "ITL p50"),
    ):
        ratio = found[measure].ratio_text()
        assert any(f"{ratio} plain" in text for text in shown), (measure, shown)  # the table's figure …
        assert words in verdict and ratio in verdict  # … is the verdict's, under the measure's name
    assert "1.02× (41.5 vs 40.7 tok/s)" in verdict and "a tie" in verdict
    assert "20.3 vs 23.8 ms, 1.17× as fast" in verdict
    assert "Small sample (192 tokens in the smallest cell, under 1024; one run per cell" in verdict
    assert "treat this as a hint" in verdict
    assert "nothing to recommend" in verdict and not lab.apply_button.isEnabled()  # a tie sends nothing
