"""What a replay replays (engine.measure.replay): a model's plain answers to a prompt set, as token ids, and its
step-cost curve as decoding pays it (in_situ.py); with a draft model, its proposal at every position of every
greedy answer (draft_replay.py) and its own curve. `on_device` swaps the curves for another device's (gpu_kit)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..chat_format import ChatFormatter
from ..decoding.calibration import calibration_sizes
from ..decoding.loader import DecoderSettings, build_decoder, load_target
from ..decoding.proposers.draft_model import check_draft
from ..decoding.runtime import Model
from ..decoding.sampling import SamplingParams
from ..lab.bench import GREEDY, answer_tokens, encode
from ..methods import DEFAULT_P_MIN, MAX_DRAFT_LIMIT
from .draft_replay import draft_runs
from .in_situ import time_in_situ

WARM_UP_TEXT = "Hello there, this is a warm up prompt of some length. "  # repeated: the cells before the timed ones


@dataclass
class Answer:
    id: str
    prompt: list[int]
    answer: list[int]  # the first token comes from the prompt's prefill; the rest are decode steps
    # With a draft model (greedy recordings): per position, how many tokens of the draft's proposal the answer
    # keeps, and how many the draft drafts (engine.measure.draft_replay).
    draft_kept: list[int] = field(default_factory=list)
    draft_made: list[int] = field(default_factory=list)


@dataclass
class Recording:
    model: str
    curve: dict[int, float]  # seconds of one step by rows verified
    answers: list[Answer]
    ends: list[int]  # end tokens among those the prompts and answers use
    temperature: float = 0.0  # the answers' sampling (0: greedy; else one answer per prompt and seed)
    draft: str = ""  # the draft model whose proposals the answers carry, if any
    draft_curve: dict[int, float] = field(default_factory=dict)  # its seconds of one decode by rows

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        raw = json.loads(Path(path).read_text())
        return cls(
            raw["model"],
            {int(k): v for k, v in raw["curve"].items()},
            [Answer(**a) for a in raw["answers"]],
            raw["ends"],
            raw.get("temperature", 0.0),
            raw.get("draft", ""),
            {int(k): v for k, v in raw.get("draft_curve", {}).items()},
        )

    def seconds(self, rows: int) -> float:
        return _interpolate(self.curve, rows)

    def draft_seconds(self, rows: int) -> float:
        return _interpolate(self.draft_curve, rows)

    @property
    def has_draft(self) -> bool:
        return bool(self.draft_curve) and all(a.draft_made for a in self.answers)


def _interpolate(curve: dict[int, float], rows: int) -> float:
    """Seconds of a decode of `rows` rows: between timed sizes, linear; past the widest, on the slope of the last
    two (a draft's catch-up over a prompt is wider than any size timed)."""
    sizes = sorted(curve)
    if rows > sizes[-1] and len(sizes) > 1:
        a, b = sizes[-2], sizes[-1]
        return curve[b] + (rows - b) * (curve[b] - curve[a]) / (b - a)
    return float(np.interp(rows, sizes, [curve[r] for r in sizes]))


def record(
    model: str,
    prompts: Sequence[dict],
    max_tokens: int,
    chat: bool = False,
    threads: int | None = None,
    temperature: float = 0.0,
    seeds: Sequence[int] = (1,),
    draft: str | None = None,
    p_min: float = DEFAULT_P_MIN,
    max_rows: int = MAX_DRAFT_LIMIT + 1,
) -> Recording:
    """Plain answers (end tokens ignored, as bench's --ignore-eos) and the step-cost curve: greedy, or at
    a temperature one per seed (ids `prompt@seed`), with SamplingParams' other filters. With a draft model
    (greedy only), its proposal at every position of every answer and its own curve too. The curves go to
    max_rows (wider steps are charged on the slope of the widest two)."""
    if draft and temperature:
        raise ValueError("a draft model's proposals are recorded along greedy answers only")
    decoder = build_decoder(DecoderSettings(model=model, method="none", threads=threads))
    target = decoder.target
    try:
        formatter = ChatFormatter(target) if chat else None
        runs = (
            [(None, GREEDY)]
            if not temperature
            else [(seed, SamplingParams(temperature=temperature, seed=seed)) for seed in seeds]
        )
        answers = []
        for item in prompts:
            tokens, _ = encode(target, formatter, item["prompt"])
            for seed, sampling in runs:
                name = str(item["id"]) if seed is None else f"{item['id']}@{seed}"
                answers.append(Answer(name, list(tokens), answer_tokens(decoder, tokens, max_tokens, sampling)))
        used = {t for a in answers for t in a.prompt + a.answer}
        context = round(statistics.mean(len(a.prompt) + len(a.answer) // 2 for a in answers))
        recording = Recording(
            target.name,
            _curve(target, context, max_rows),
            answers,
            sorted(t for t in used if target.is_end(t)),
            temperature,
        )
        if draft:
            _record_draft(recording, draft, target, threads, p_min, context, max_rows)
    finally:
        target.close()
    return recording


def _curve(model: Model, context: int, max_rows: int = MAX_DRAFT_LIMIT + 1) -> dict[int, float]:
    """Seconds of one decode by rows, 1 to max_rows, as decoding pays them (in_situ.py), after
    `context` cells (the answers' midpoint, on average)."""
    filler = model.tokenize(WARM_UP_TEXT, add_bos=False)
    cells = (filler * (1 + context // len(filler)))[: max(1, context)]
    model.forget_all()
    model.prefill(cells, 0, 0)
    curve = time_in_situ(model, len(cells), cells[-1], calibration_sizes(max_rows))
    model.forget_all()
    return curve


def _record_draft(
    recording: Recording, draft: str, target: Model, threads: int | None, p_min: float, context: int, max_rows: int
) -> None:
    """The draft's curve and proposals, once it is known to fit the target (as the live draft method checks)."""
    model = load_target(DecoderSettings(model=draft, method="none", threads=threads))
    try:
        check_draft(model, target, p_min)
        recording.draft, recording.draft_curve = model.name, _curve(model, context, max_rows)
        for a in recording.answers:
            a.draft_kept, a.draft_made = draft_runs(model, a.prompt, a.answer, p_min)
    finally:
        model.close()


def on_device(recording: Recording, curves_path: str | Path, shape: str, draft_shape: str | None = None) -> Recording:
    """The recording's answers on another device's step costs: one shape's curve from a gpu_kit curves file
    (and the draft's, from another shape's)."""
    shapes = json.loads(Path(curves_path).read_text())["shapes"]

    def curve_of(name: str) -> dict[int, float]:
        if name not in shapes:
            raise ValueError(f"{curves_path} has no curve for {name!r}; it has {', '.join(shapes)}")
        return {int(rows): seconds for rows, seconds in shapes[name]["seconds_by_rows"].items()}

    found = shapes.get(shape, {})
    curve = curve_of(shape)
    draft_curve = curve_of(draft_shape) if draft_shape else {}
    drafted_by = f" (draft on {draft_shape}'s)" if draft_shape else ""
    return Recording(
        f"{recording.model} on {shape}'s {found.get('backend', '?')} step costs{drafted_by}",
        curve,
        recording.answers,
        recording.ends,
        recording.temperature,
        recording.draft if draft_shape else "",
        draft_curve,
    )
