"""A draft model's proposals recorded along greedy answers and replayed (engine.measure.draft_replay): what it
would draft and what the answer keeps, position by position; the real StepLoop's draft and auto on a virtual clock."""

import json
import random

import numpy as np
import pytest

from engine.lab.bench import GREEDY
from engine.measure import recording, replay
from engine.measure.draft_replay import draft_runs
from engine.measure.recording import Answer, Recording

pytestmark = pytest.mark.slow  # recorded drafts replayed against live drafting

# A CPU-like target: each extra verified row 15% of a step. A GPU-like one: 1%.
CPU = {rows: 0.010 * (1 + 0.15 * (rows - 1)) for rows in list(range(1, 18)) + [24, 32, 48, 64, 65]}
GPU = {rows: 0.010 * (1 + 0.01 * (rows - 1)) for rows in CPU}


class ScriptedDraft:
    """A stand-in draft model with a KV cache by position: after a history it predicts `guess(history)` with the
    confidence `confidence(history)` (the logits are built to give exactly that probability)."""

    n_batch, n_vocab = 8, 200

    def __init__(self, guess, confidence):
        self.guess, self.confidence = guess, confidence
        self.cells: dict[int, int] = {}
        self.decodes = 0

    def forget_all(self):
        self.cells.clear()

    def forget_from(self, pos, seq_id=0):
        self.cells = {p: t for p, t in self.cells.items() if p < pos}

    def decode_multi(self, tokens, positions, seq_ids, want):
        self.decodes += 1
        rows = []
        for token, pos, w in zip(tokens, positions, want):
            assert all(p in self.cells for p in range(pos)), "a decode past a gap in the cache"
            self.cells[pos] = token
            if w:
                history = [self.cells[p] for p in range(pos + 1)]
                row = np.zeros(self.n_vocab, dtype=np.float32)
                c = self.confidence(history)  # p = e^x / (e^x + n - 1)  =>  x = log(c (n - 1) / (1 - c))
                row[self.guess(history)] = np.log(c * (self.n_vocab - 1) / (1 - c))
                rows.append(row)
        return np.array(rows)


def test_the_runs_count_what_the_answer_keeps_and_what_the_draft_drafts():
    """The draft follows the answer, except that after 3 answer tokens it is confidently wrong (99), then sure of
    two more tokens of its own; after 6 it is unsure. So from position 1 it drafts 2 the answer keeps, then 99,
    then 2 more: 5 drafted, 2 kept; from 3, 3 drafted, none kept; from 4, 2 and 2; from 6 and on nothing."""
    prompt, answer = [1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 17]
    truth = prompt + answer

    def guess(history):
        if (
            history[len(prompt) : len(prompt) + 3] == answer[:3]
            and len(history) > len(prompt) + 3
            and history[len(prompt) + 3] == 99
        ):
            return 150 + len(history)  # its own continuation after the mistake
        i = len(history)
        return 99 if i == len(prompt) + 3 else truth[i] if i < len(truth) else 0

    def confidence(history):
        i = len(history) - len(prompt)  # answer tokens written
        if history[len(prompt) + 3 : len(prompt) + 4] == [99]:
            return 0.9 if len(history) <= len(prompt) + 5 else 0.5  # 2 more confident tokens, then unsure
        return 0.5 if i >= 6 else 0.9

    draft = ScriptedDraft(guess, confidence)
    kept, made = draft_runs(draft, prompt, answer, p_min=0.75)
    assert kept == [0, 2, 1, 0, 2, 1, 0, 0]
    assert made == [0, 5, 4, 3, 2, 1, 0, 0]
    assert draft_runs(draft, prompt, answer, p_min=0.75, longest=3) == (
        [0, 2, 1, 0, 2, 1, 0, 0],
        [0, 3, 3, 3, 2, 1, 0, 0],
    )


def well_guessed(n_answers: int = 3) -> list[Answer]:
    """Answers a draft guesses 6 tokens at a time (then one wrong, confidently), and one it never guesses."""
    rng = random.Random(5)
    answers = []
    for i in range(n_answers):
        prompt, answer = rng.sample(range(100, 5000), 40), rng.sample(range(6000, 9000), 120)
        kept = [6 - (j % 7) if j % 7 < 6 else 0 for j in range(len(answer))]
        answers.append(Answer(f"guessed-{i}", prompt, answer, kept, [k + 1 for k in kept]))
    prompt, answer = rng.sample(range(100, 5000), 40), rng.sample(range(6000, 9000), 120)
    answers.append(Answer("never", prompt, answer, [0] * 120, [2] * 120))
    return answers


def with_draft(curve: dict, draft_curve: dict) -> Recording:
    return Recording("synthetic", curve, well_guessed(), ends=[], draft="synthetic draft", draft_curve=draft_curve)


def test_a_cheap_draft_pays_where_rows_are_nearly_free_and_an_expensive_one_is_declined():
    cheap = {rows: 0.1 * s for rows, s in GPU.items()}  # a draft token a tenth of a target step
    on_gpu = with_draft(GPU, cheap)
    draft, auto = replay.replay_method(on_gpu, "draft"), replay.replay_method(on_gpu, "auto")
    assert min(draft[:3]) > 2.5 and min(auto[:3]) > 2.5, (draft, auto)
    assert draft[3] > 0.85 and auto[3] > 0.85, (draft, auto)  # never guessed: probes only, soon given up
    # A draft as dear as its target never pays: declined from its timing alone, so plain decoding exactly.
    as_dear = with_draft(CPU, CPU)
    assert replay.replay_method(as_dear, "draft") == pytest.approx([1.0] * 4)
    assert replay.replay_method(as_dear, "auto") == pytest.approx(replay.replay_lookup(as_dear))


def test_draft_and_auto_need_the_drafts_recorded():
    lookup_only = Recording("synthetic", CPU, [Answer("a", [1, 2, 3], [4, 5, 6])], ends=[])
    with pytest.raises(ValueError, match="record --draft"):
        replay.replay_method(lookup_only, "auto")
    assert "| draft | auto |" not in replay.report(lookup_only, 48)


def count_replayed(rec: Recording, max_draft: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per answer of the draft method at fixed lengths."""
    steps = []
    replay.replay_method(rec, "draft", max_draft, on_step=steps.append, adaptive=False)
    return [
        (sum(t.drafted for t in steps if t.answer == a.id), sum(t.accepted for t in steps if t.answer == a.id))
        for a in rec.answers
    ]


def count_live(target_path, draft_path, rec: Recording, max_draft: int) -> list[tuple[int, int]]:
    from engine.decoding.loader import DecoderSettings, build_decoder

    decoder = build_decoder(
        DecoderSettings(
            model=str(target_path),
            draft=str(draft_path),
            method="draft",
            max_draft=max_draft,
            adaptive=False,
            threads=2,
            remember_requests=False,
        )
    )
    out = []
    try:
        for a in rec.answers:
            written = [
                t
                for d in decoder.generate(a.prompt, GREEDY, max_tokens=len(a.answer), ignore_eos=True)
                for t in d.tokens
            ]
            assert written == a.answer
            out.append((decoder.stats.drafted, decoder.stats.accepted))
    finally:
        decoder.target.close()
        decoder.loop.proposer.model.close()
    return out


def test_recorded_drafts_replay_as_the_live_draft_drafts(tmp_path, capsys):
    """SmolLM2 drafting for itself, recorded through the command line: at fixed draft lengths the replay drafts
    and keeps exactly the tokens the live draft method does, answer by answer."""
    from engine.modelfiles.embedded import embedded_model_path

    model = embedded_model_path()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"id": "list", "prompt": "Repeat this list exactly: apples, pears, plums, figs, limes."}\n'
        '{"id": "story", "prompt": "Write two sentences about a lighthouse keeper."}\n'
    )
    out = tmp_path / "rec.json"
    assert (
        replay.main(
            [
                "record",
                "--model",
                str(model),
                "--draft",
                str(model),
                "--prompts",
                str(prompts),
                "--max-tokens",
                "40",
                "--threads",
                "2",
                "--chat",
                "--max-rows",
                "17",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rec = Recording.load(out)
    assert rec.has_draft and rec.draft_curve[1] > 0
    for a in rec.answers:  # the draft is the target: whatever it drafts, the answer keeps
        assert a.draft_kept == a.draft_made and any(a.draft_kept)
    replayed = count_replayed(rec, 4)
    assert replayed == count_live(model, model, rec, 4) and all(d > 0 for d, _ in replayed), replayed

    capsys.readouterr()
    assert replay.main(["replay", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| draft | auto |" in table and "geomean: lookup" in table
    with pytest.raises(SystemExit):
        replay.main(
            [
                "record",
                "--model",
                str(model),
                "--draft",
                str(model),
                "--prompts",
                str(prompts),
                "--temperature",
                "0.7",
                "--out",
                str(out),
            ]
        )


def test_a_prediction_charges_the_draft_its_own_shapes_curve(tmp_path, capsys):
    rec_path, curves = tmp_path / "rec.json", tmp_path / "curves.json"
    with_draft(CPU, CPU).save(rec_path)

    def seconds(curve):
        return {str(rows): s for rows, s in curve.items()}

    curves.write_text(
        json.dumps(
            {
                "shapes": {
                    "qwen2-1.5b": {"backend": "CUDA", "seconds_by_rows": seconds(GPU)},
                    "qwen2-0.5b": {"backend": "CUDA", "seconds_by_rows": seconds({r: 0.1 * s for r, s in GPU.items()})},
                }
            }
        )
    )
    on_gpu = recording.on_device(Recording.load(rec_path), curves, "qwen2-1.5b", "qwen2-0.5b")
    assert on_gpu.has_draft and on_gpu.draft_seconds(1) == pytest.approx(0.001)
    assert min(replay.replay_method(on_gpu, "draft")[:3]) > 2.5
    assert not recording.on_device(Recording.load(rec_path), curves, "qwen2-1.5b").has_draft
    capsys.readouterr()
    assert (
        replay.main(
            ["replay", str(rec_path), "--curves", str(curves), "--shape", "qwen2-1.5b", "--draft-shape", "qwen2-0.5b"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "(draft on qwen2-0.5b's)" in out and "| draft | auto |" in out


def test_the_real_pair_replays_as_it_drafts_live(tmp_path):
    """The Qwen2.5-Coder pair, where the 0.5B is confidently wrong at times and drafts on from its own mistake:
    the replay's fixed-length drafts and kept tokens are the live ones."""
    from engine.measure.real_pair import DRAFT, TARGET, pair_dir

    target, draft = pair_dir() / TARGET.file_name, pair_dir() / DRAFT.file_name
    if not (target.is_file() and draft.is_file()):
        pytest.skip("the Qwen2.5-Coder pair is not fetched (python -m engine.measure.real_pair)")
    prompts = tmp_path / "p.jsonl"  # early in its answer the 0.5B is confidently wrong (from open.jsonl)
    prompts.write_text('{"id": "science", "prompt": "Photosynthesis is the process by which plants"}\n')
    rec = recording.record(
        str(target), replay.read_prompts(prompts), 32, chat=True, threads=2, draft=str(draft), max_rows=17
    )
    a = rec.answers[0]
    assert any(m > k for k, m in zip(a.draft_kept, a.draft_made)), "no confident mistake to follow"
    assert count_replayed(rec, 6) == count_live(target, draft, rec, 6)


def test_a_step_wider_than_any_timed_is_charged_on_the_slope_of_the_widest_two():
    """A draft's catch-up over a prompt is wider than any size a curve times: charged on the last slope, not the
    widest size's cost (np.interp alone would have charged a 300-row prefill as one 65-row step)."""
    rec = Recording("synthetic", {1: 1.0, 2: 2.0, 4: 3.0}, [], ends=[])
    assert rec.seconds(3) == pytest.approx(2.5) and rec.seconds(8) == pytest.approx(5.0)


def test_a_draft_whose_vocabulary_does_not_fit_is_refused_with_a_message(tmp_path, capsys):
    """As the live draft method refuses it: Gemma 3 cannot draft for SmolLM2, and the command says why."""
    from engine.modelfiles.embedded import embedded_gemma_path, embedded_model_path

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "hi", "prompt": "Hello"}\n')
    out = tmp_path / "rec.json"
    code = replay.main(
        [
            "record",
            "--model",
            str(embedded_model_path()),
            "--draft",
            str(embedded_gemma_path()),
            "--prompts",
            str(prompts),
            "--max-tokens",
            "4",
            "--max-rows",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 2 and not out.exists()
    assert "vocabular" in capsys.readouterr().err.lower()
