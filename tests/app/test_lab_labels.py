"""What the lab window says about its figures, at its default size (offscreen): the table explains its
columns, no header is cut, the advice and the recommendation agree on the draft length, and the model
field names the built-in model while the run gets its key. A saved results document is loaded, as with
"Load results…", so no model has to run."""

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QStyle

from engine.lab.report import best_draft_length
from engine.modelfiles.embedded import DISPLAY_NAMES, EMBEDDED, EMBEDDED_GEMMA

from support.window import collect_garbage_now

# Acceptance by draft slot and step times by verified rows, as a CPU run of prompt lookup reads them: the
# best fixed draft length for one chat comes out at 6, well under the chat's cap of 48.
ACCEPTANCE_BY_SLOT = [0.95, 0.9, 0.85, 0.8, 0.7, 0.5, 0.35, 0.1, 0.05, 0.02]
STEP_MS_BY_ROWS = {1: 20.0, 2: 23.0, 4: 27.0, 8: 36.0, 16: 58.0}


def cell(method, concurrency, aggregate, per_request, kind="CPU", memory="RAM"):
    lookup = method == "lookup"
    return {
        "method": method,
        "concurrency": concurrency,
        "requests": 2 * concurrency,
        "generated_tokens": 256 * concurrency,
        "wall_s": 256 * concurrency / aggregate,
        "aggregate_tokens_per_s": aggregate,
        "per_request_tokens_per_s": per_request,
        "full_tokens_per_s": round(1.1 * aggregate, 2),
        "itl_p50_ms": 1000 / per_request,
        "itl_p95_ms": 3000 / per_request,
        "e2e_p50_s": 14.25,
        "e2e_p95_s": 17.5,
        "ttft_p50_s": 0.8,
        "drafted": 100 if lookup else 0,
        "accepted": 60 if lookup else 0,
        "verify_steps": 40 if lookup else 0,
        "acceptance_rate": 0.6 if lookup else None,
        "mean_acceptance_length": 2.5 if lookup else None,
        "per_position_acceptance": ACCEPTANCE_BY_SLOT if lookup else [],
        "batch_steps": 200,
        "rows_per_step": 1.0,
        "step_time_by_rows": {str(r): {"steps": 20, "mean_ms": ms} for r, ms in STEP_MS_BY_ROWS.items()},
        "draft_ms_per_token": None,
        "prefill_s": 1.2,
        "utilisation": {"kind": kind, "percent": 100.0, "source": "test"},
        "memory": {"kind": memory, "bytes": 12.4 * 2**30, "source": "test"},
    }


def results_document(kind="CPU", memory="RAM"):
    levels = (1, 2, 4, 8, 16)
    return {
        "schema": 1,
        "created": "2025-01-01T00:00:00+0000",
        "settings": {
            "prompts": "grounded.jsonl",
            "prompt_set": "grounded",
            "prompt_count": 2,
            "model": "embedded",
            "draft": None,
            "methods": ["none", "lookup"],
            "concurrency": list(levels),
            "max_tokens": 128,
            "max_draft": 10,
            "adaptive": False,
            "temperature": 0.0,
            "repeats": 1,
        },
        "env": {"backend": kind, "threads": 2, "model_name": "SmolLM2"},
        # aggregate 7.8 beside per-request 29.2 at concurrency 1, as the user saw
        "cells": [
            c
            for level in levels
            for c in (
                cell("none", level, 7.8 * level**0.5, 29.2 / level**0.3, kind, memory),
                cell("lookup", level, 12.0 * level**0.4, 48.0 / level**0.4, kind, memory),
            )
        ],
    }


@pytest.fixture
def lab(qtbot):
    from app.lab.window import LabWindow

    window = LabWindow()  # at its default size
    qtbot.addWidget(window)
    with qtbot.waitExposed(window):
        window.show()
    yield window
    window.shutdown()
    collect_garbage_now()


def load(lab, tmp_path, document):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    lab.load_results(path)


def header_tip(table, column):
    return table.model().headerData(column, Qt.Horizontal, Qt.ToolTipRole) or ""


def header_text(table, column):
    return table.model().headerData(column, Qt.Horizontal, Qt.DisplayRole)


def test_the_table_says_what_aggregate_and_per_request_tok_s_measure(lab, qtbot, tmp_path):
    load(lab, tmp_path, results_document())
    columns = {header_text(lab.table, c).replace("\n", " "): c for c in range(lab.table.columnCount())}
    # each tok/s column says what it counts: all requests' tokens, or one request's after its first token
    aggregate, per_request = (
        columns["all requests' tok/s: full · aggregate"],
        columns["per-request tok/s after 1st token"],
    )
    assert lab.table.item(0, aggregate).text() == "8.6\n7.8" and lab.table.item(0, per_request).text() == "29.2"

    tip = header_tip(lab.table, aggregate)
    assert "every slot busy" in tip and "prefills left out" in tip
    assert "all generated tokens, the fillers' included" in tip and "wall time" in tip and "prefills count" in tip
    tip = header_tip(lab.table, per_request)
    assert "one request's generated tokens after its first" in tip and "predicted_per_second" in tip
    assert "Prefill and waiting" in tip and "left out" in tip
    assert all(header_tip(lab.table, c) for c in range(lab.table.columnCount()))  # every column says what it is

    legend = lab.table_legend
    assert legend.isVisible() and legend.geometry().top() >= lab.table.geometry().bottom()  # under the table
    assert "all requests' tokens ÷ the level's whole wall time" in legend.text() and "prefills" in legend.text()
    assert "decode speed" in legend.text() and "every slot of the level was busy" in legend.text()


def test_the_table_says_mean_accepted_length_and_sizes_in_mib(lab, qtbot, tmp_path):
    document = results_document()
    for c in document["cells"]:
        c["draft_share"], c["draft_model_bytes"] = (0.25, 520 * 2**20) if c["method"] == "lookup" else (None, None)
    load(lab, tmp_path, document)
    columns = {header_text(lab.table, c).replace("\n", " "): c for c in range(lab.table.columnCount())}
    acceptance = columns["acceptance · mean accepted length"]
    assert "Mean accepted length" in header_tip(lab.table, acceptance)
    texts = [lab.table.item(r, c).text() for r in range(lab.table.rowCount()) for c in range(lab.table.columnCount())]
    assert "25%\n520 MiB" in texts and "RAM 12698 MiB" in "\n".join(texts)  # 12.4 GiB of RAM, in MiB
    assert not any("GiB" in t for t in texts)
    tips = " ".join(header_tip(lab.table, c) for c in range(lab.table.columnCount()))
    assert "acceptance length" not in tips and "MiB" in tips


def test_the_advice_and_the_recommendation_agree_on_the_draft_length(lab, qtbot, tmp_path):
    document = results_document()
    document["settings"].update(max_draft=48, adaptive=True)  # the lab ran the chat's default cap
    lab.set_chat_models("embedded", None, "none")  # as the chat window passes them: speculation off
    load(lab, tmp_path, document)
    k = best_draft_length(document, "lookup")
    cap = lab.recommendation["max_draft"]
    assert k == 6 and cap == 48  # the two numbers the user saw side by side, as this run gives them

    advice, recommended = lab.advice.text().split("Recommended for the chat")
    assert f"prompt lookup with k={k} is best" in advice
    # The recommendation names both numbers and says how they differ, rather than a bare "max draft: 48".
    assert f"k={k}" in recommended and "best fixed draft length" in recommended
    assert f"at most {cap} tokens a step" in recommended and f"{cap} is only its upper limit" in recommended
    assert "adaptive" in recommended and "prompt lookup" in recommended

    with qtbot.waitSignal(lab.applySettings) as applied:
        lab.apply_button.click()
    # what was recommended, the cap and mode as the lab ran them (the chat's were not passed)
    assert applied.args[0] == {"method": "lookup", "max_draft": cap, "adaptive": True}


@pytest.mark.parametrize("document", [None, "CPU", "GPU"], ids=["empty", "CPU run", "GPU run"])
def test_every_header_is_readable_at_the_default_size(lab, qtbot, tmp_path, document):
    if document == "GPU":
        load(lab, tmp_path, results_document("GPU", "VRAM"))
    elif document:
        load(lab, tmp_path, results_document())
    qtbot.wait(50)  # the header's sizes settle on the next layout pass
    table, header = lab.table, lab.table.horizontalHeader()
    metrics, margin = header.fontMetrics(), header.style().pixelMetric(QStyle.PM_HeaderMargin, None, header)
    for column in range(table.columnCount()):
        lines = header_text(table, column).split("\n")
        wide = max(metrics.horizontalAdvance(line) for line in lines)
        assert header.sectionSize(column) >= wide + 2 * margin, f"{lines} is cut"
        assert header.height() >= len(lines) * metrics.lineSpacing(), f"{lines} is cut"
        right = header.sectionViewportPosition(column) + header.sectionSize(column)
        assert header.sectionViewportPosition(column) >= 0 and right <= table.viewport().width(), (
            f"{lines} is out of sight without scrolling"
        )
    assert not table.horizontalScrollBar().isVisible()


def shown(field):
    return field.currentText() if isinstance(field, QComboBox) else field.text()


def test_the_target_model_field_shows_the_models_name_and_runs_the_model(lab, qtbot, monkeypatch):
    started = []
    monkeypatch.setattr(lab.runner, "start", started.append)  # the config the run would get, without running

    assert shown(lab.model_edit) == DISPLAY_NAMES[EMBEDDED]
    lab.run_button.click()
    assert started[-1].model == EMBEDDED

    lab.runner.cancelled.emit()  # that run ends, and the field can be changed again
    lab.model_edit.setCurrentIndex(lab.model_edit.findText(DISPLAY_NAMES[EMBEDDED_GEMMA]))
    assert shown(lab.model_edit) == DISPLAY_NAMES[EMBEDDED_GEMMA]
    lab.run_button.click()
    assert started[-1].model == EMBEDDED_GEMMA

    lab.runner.cancelled.emit()
    lab.model_edit.setEditText("/models/my-model.gguf")  # as Browse… fills it in, or as typed
    lab.run_button.click()
    assert started[-1].model == "/models/my-model.gguf"


def test_the_charts_legend_is_short_and_each_crossover_line_has_its_methods_colour(lab, qtbot, tmp_path):
    document = results_document()
    for c in document["cells"]:
        if c["method"] == "lookup" and c["concurrency"] >= 4:  # lookup stops paying between 2 and 4
            c["full_tokens_per_s"] *= 0.6
    load(lab, tmp_path, document)
    chart = lab.rate_chart
    assert chart.chart_.title() == "Decode throughput, every slot busy"
    labels = [m.label() for m in chart.chart_.legend().markers()]
    assert labels == ["plain", "lookup", "lookup stops paying"]  # the long words were cut to "plain deco…"
    (line,) = chart.markers
    assert line.pen().color() == chart.series["lookup"].color() and 2 < line.points()[0].x() < 4


def test_results_with_only_the_aggregate_are_charted_as_such(lab, qtbot, tmp_path):
    document = results_document()  # as results saved before full load was measured are
    for c in document["cells"]:
        del c["full_tokens_per_s"]
    load(lab, tmp_path, document)
    assert lab.rate_chart.chart_.title() == "Aggregate throughput"
    assert lab.rate_chart.points("none")[0] == (1, pytest.approx(7.8))
    columns = {header_text(lab.table, c).replace("\n", " "): c for c in range(lab.table.columnCount())}
    assert lab.table.item(0, columns["all requests' tok/s: full · aggregate"]).text() == "n/a\n7.8"
