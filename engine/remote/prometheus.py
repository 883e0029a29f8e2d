"""Speculation figures from a server's Prometheus /metrics: vLLM's spec-decode counters, read before and after
an answer and differenced.

The names are vLLM's (vllm/v1/spec_decode/metrics.py, SpecDecodingProm, checked against v0.21 – v0.32's docs):
counters vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens and
_num_accepted_tokens_per_pos (label position="j"), exposed with the _total suffix, one series per engine (and
model_name); they are summed over series. A delta covers every request the server finished meanwhile, so it is
this answer's only when nothing else ran: vllm:num_requests_running before and vllm:request_success_total's
delta say whether something did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..figures import mean_accepted_length

PREFIX = "vllm:spec_decode_"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
RUNNING = "vllm:num_requests_running"
FINISHED = "vllm:request_success_total"
WANTED = (PREFIX, RUNNING, FINISHED)  # the only series read: a server's others are none of this module's business
MAX_LINE_CHARS = 4096  # vLLM's lines are under 300 characters; a longer one is skipped unread (the regex's cost grows)
MAX_SERIES = 10_000  # of those wanted: vLLM has one per engine, draft position and finish reason, hundreds at most
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(
    text: str, wanted: tuple[str, ...] | None = None, max_series: int = MAX_SERIES
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples of a Prometheus text exposition: {(name, sorted labels): value}, of the names starting with one of
    wanted (all when None). Comments, malformed lines and lines over MAX_LINE_CHARS are skipped; ValueError past
    max_series samples (no server has that many of these: the text is not to be trusted)."""
    out = {}
    for line in text.split("\n"):  # the format's only line end (a label value may hold U+2028)
        line = line.strip()
        if not line or line.startswith("#") or len(line) > MAX_LINE_CHARS:
            continue
        if wanted is not None and not line.startswith(wanted):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        out[(name, tuple(sorted(_LABEL.findall(labels or ""))))] = number
        if len(out) > max_series:
            raise ValueError(f"more than {max_series:,} series")
    return out


@dataclass
class SpecCounters:
    """The spec-decode counters at one moment, summed over engines; None where the server has no such series."""

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    per_position: dict[int, float] = field(default_factory=dict)
    running: float | None = None  # requests running at that moment
    finished: float | None = None  # requests finished so far (every finish reason)

    @classmethod
    def from_text(cls, text: str) -> SpecCounters:
        """The counters in a /metrics text; ValueError where it has more than MAX_SERIES of them."""
        counters = cls()
        for (name, labels), value in parse(text, WANTED).items():
            if name == PER_POSITION:
                position = dict(labels).get("position")
                if position is not None and position.isdigit():
                    counters.per_position[int(position)] = counters.per_position.get(int(position), 0.0) + value
                continue
            attribute = {
                DRAFTS: "drafts",
                DRAFT_TOKENS: "draft_tokens",
                ACCEPTED: "accepted",
                RUNNING: "running",
                FINISHED: "finished",
            }.get(name)
            if attribute:
                setattr(counters, attribute, (getattr(counters, attribute) or 0.0) + value)
        return counters

    @property
    def speculates(self) -> bool:
        return self.draft_tokens is not None


@dataclass(frozen=True)
class SpecDelta:
    """What the counters moved by over one answer."""

    drafts: int
    drafted: int
    accepted: int
    per_position_acceptance: list[float]  # accepted at draft position j ÷ drafts
    alone: bool | None  # True: no other request ran meanwhile (by the server's counters); None: cannot tell

    @property
    def mean_acceptance_length(self) -> float | None:
        return mean_accepted_length(self.accepted, self.drafts)

    def note(self) -> str:
        if self.alone:
            return "from the server's /metrics counters; no other request ran meanwhile"
        if self.alone is None:
            return "from the server's /metrics counters; uncertain: other clients' requests would be counted too"
        return "from the server's /metrics counters, which other requests moved too: uncertain"


def delta(before: SpecCounters, after: SpecCounters) -> SpecDelta | None:
    """after − before, or None when the server reports no spec-decode counters."""
    if before.draft_tokens is None or after.draft_tokens is None:  # not both .speculates
        return None
    drafts = round((after.drafts or 0.0) - (before.drafts or 0.0))
    per_position = [
        ((after.per_position.get(j, 0.0) - before.per_position.get(j, 0.0)) / drafts if drafts else 0.0)
        for j in sorted(after.per_position)
    ]
    alone = None
    if before.running is not None and before.finished is not None and after.finished is not None:
        alone = before.running == 0 and round(after.finished - before.finished) == 1
    return SpecDelta(
        drafts,
        round(after.draft_tokens - before.draft_tokens),
        round((after.accepted or 0.0) - (before.accepted or 0.0)),
        per_position,
        alone,
    )
