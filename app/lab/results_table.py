"""The lab's measured cells as a table: one row per method and concurrency, "n/a" where nothing was read.

Each header says what its figure counts, its tooltip how it is measured (engine/lab/metrics.py), and LEGEND,
shown under the table, how full-load, aggregate and per-request tokens/s differ. Under a method's figures, its
ratio to plain decoding's comes from engine/lab/compare.py, as the verdict's do."""

from __future__ import annotations

from PySide6.QtWidgets import QHeaderView, QTableWidget, QTableWidgetItem

from engine.figures import FIGURE, NA
from engine.lab.compare import Comparison, compare
from engine.lab.report import memory_text, method_words, utilisation_text

_SPEED, _RATE, _LENGTH = FIGURE["tokens_per_s"], FIGURE["acceptance_rate"], FIGURE["mean_acceptance_length"]
# Two-line headers and two-line cells where they are wide: at the window's default size every column
# fits beside the charts, so no header is cut and no column hides behind a scroll bar.
HEADERS = [
    "method",
    "concur-\nrency",
    f"all requests'\n{_SPEED.unit}: full\n· aggregate",
    f"per-request\n{_SPEED.unit} after\n1st token",
    "ITL ms\np50 / p95",
    "end-to-end s\np50 / p95",
    "acceptance ·\nmean accepted\nlength",
    "drafting\n· model",
    "utilisation\n· memory",
]
HEADER_TIPS = [
    "The decoding method: plain decoding is the baseline every speed-up is measured against.",
    "How many requests were decoded at once, in one batch. Each level decodes every prompt at least once; until "
    "the last is answered, a slot that frees once none waits takes a filler (the same prompts again, in turn), as "
    "a busy server's queue would refill it. Below it, the mean actually in flight (weighted by step time).",
    "All requests' tokens, two ways. Full load (above): the tokens delivered by the steps that had every slot busy ÷ those steps' time, prefills "
    "left out: what the level itself decodes. The chart, the speed-ups and where speculation stops paying use it. "
    "Aggregate (below): all generated tokens, the fillers' included, ÷ the whole level's wall time, from its first "
    "request's prefill to its last request's last token: prefills count, so even at concurrency 1 it is below the "
    "per-request speed, and a filler admitted just before the level ends pays its whole prefill for a few tokens.",
    "Per-request decode speed: one request's generated tokens after its first ÷ the time from its first token to "
    "its last (the chat's tok/s; llama.cpp's predicted_per_second counts the first token too), the mean over the "
    "level's requests. Prefill and "
    "waiting for a turn are left out.",
    "Inter-token latency in milliseconds: the time between a request's tokens after its first (a step that "
    "delivers m tokens counts as m gaps of 1/m of its time); median and 95th percentile over all tokens.",
    "End-to-end seconds: from a request's admission (its prefill) to its last token; median and 95th "
    "percentile over the level's requests.",
    "Acceptance: accepted ÷ drafted tokens. Mean accepted length (tok/step): tokens each step that verified "
    "drafts produced, 1 + accepted ÷ such steps. n/a for plain decoding, which drafts nothing.",
    "Drafting: the share of the level's wall time spent proposing drafts (a draft model's decodes, its catch-up "
    "on each prompt included; lookup's search). Model: the draft model's weights in memory. n/a for plain "
    "decoding; 'none' where no draft model runs. Sizes in MiB.",
    "Utilisation: the GPU's (NVML) where it can be read, else this process's CPU time ÷ wall time as a share "
    "of all cores. Memory: VRAM where it can be read, else the process's resident RAM, after the level (MiB).",
]
LEGEND = (
    "Full load: all requests' decode tokens ÷ the time every slot of the level was busy (servers: while as many "
    "answers streamed at once as ever did), the figure speed-ups are judged by. "
    "Aggregate: all requests' tokens ÷ the level's whole wall time, prefills included. Per-request: one request's "
    "decode speed, its generated tokens after the first ÷ the time after its first token. "
    "“× plain”: the method's figure ÷ plain decoding's at the same concurrency, above 1 better (ITL: plain's "
    "ms ÷ the method's). Hover a header for how each figure is measured."
)


def _fmt(value, fmt: str) -> str:
    return NA if value is None else format(value, fmt)


def _vs(found: dict[str, Comparison], key: str) -> str:
    """A method's ratio to plain decoding under its figure; nothing for plain decoding itself."""
    return f"\n{found[key].ratio_text()} plain" if key in found else ""


def cell_texts(c: dict, found: dict[str, Comparison] | None = None) -> list[str]:
    """What the table shows of one cell, column by column; `found`: its comparisons with plain decoding."""
    found = found or {}
    acc = c.get("acceptance_rate")
    in_flight = c.get("mean_in_flight")
    return [
        method_words(c["method"]),
        str(c["concurrency"]) + ("" if in_flight is None else f"\n{in_flight:.1f} avg"),
        f"{_SPEED.value_text(c.get('full_tokens_per_s'))}\n{_SPEED.value_text(c.get('aggregate_tokens_per_s'))}"
        + _vs(found, "throughput"),
        _SPEED.value_text(c.get("per_request_tokens_per_s")) + _vs(found, "per_request"),
        f"{_fmt(c.get('itl_p50_ms'), '.1f')} / {_fmt(c.get('itl_p95_ms'), '.1f')}" + _vs(found, "latency"),
        f"{_fmt(c.get('e2e_p50_s'), '.2f')} / {_fmt(c.get('e2e_p95_s'), '.2f')}",
        NA if acc is None else f"{_RATE.value_text(acc)} · {_LENGTH.value_text(c.get('mean_acceptance_length'))}",
        drafting_text(c),
        f"{utilisation_text(c)}\n{memory_text(c)}",
    ]


def drafting_text(c: dict) -> str:
    share, size = c.get("draft_share"), c.get("draft_model_bytes")
    if c["method"] == "none" or share is None:
        return NA
    return f"{share:.0%}\n" + (f"{size / 2**20:.0f} MiB" if size else "none")


class ResultsTable(QTableWidget):
    def __init__(self, parent=None):
        super().__init__(0, len(HEADERS), parent)
        for col, (text, tip) in enumerate(zip(HEADERS, HEADER_TIPS)):
            item = QTableWidgetItem(text)
            item.setToolTip(tip)
            self.setHorizontalHeaderItem(col, item)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)  # wide enough for header and cells, always
        header.setStretchLastSection(True)
        self.verticalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)  # two-line cells
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QTableWidget.NoEditTriggers)

    def show_cells(self, cells: list[dict]) -> None:
        """Every measured cell, each method's ratios to plain decoding under its figures (compare(), as the
        verdict reads them); called again as cells come in, since plain decoding's cell may come later."""
        found = compare({"cells": cells})
        self.setRowCount(0)
        for cell in cells:
            row = self.rowCount()
            self.insertRow(row)
            for col, text in enumerate(cell_texts(cell, found.get((cell["method"], cell["concurrency"])))):
                self.setItem(row, col, QTableWidgetItem(text))
