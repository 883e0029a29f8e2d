"""Chunked prefill (issue 51): a long prompt is prefilled a piece per pump, the other sequences taking their
decode step between pieces, and a job cancelled in its prefill frees its sequence id within one piece. With the
real embedded SmolLM2 (the server's default model), counted in pieces and steps, never in wall time."""

import pytest
import torch

from engine.decoding.batch import MIN_PIECE, PREFILL_CHUNK, Batch, Job, prefill_piece
from engine.decoding.pump import run_jobs
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig
from engine.decoding.step import StepLoop
from engine.modelfiles.embedded import embedded_model_path

from support.greedy_check import assert_self_consistent

pytestmark = pytest.mark.slow  # long prompts prefilled piece by piece on the real model

GREEDY = SamplingParams(temperature=0.0)
LONG = 3000  # the long prompt


@pytest.fixture(scope="module")
def target():
    model = Model(embedded_model_path(), LoadSettings(n_ctx=4096, threads=2, n_seq_max=2))
    yield model
    model.close()


@pytest.fixture(scope="module")
def prompts(target):
    text = " ".join(
        f"Note {i}: the ferry to island {i % 17} leaves at {i % 12 + 1} o'clock, weather {i % 5}." for i in range(400)
    )
    long = target.tokenize(text)[:LONG]
    assert len(long) == LONG
    return target.tokenize("The best way to spend three days in Kyoto is"), long


def new_batch(target: Model, slots: int = 2, **kwargs) -> Batch:
    target.forget_all()
    return Batch(StepLoop(target, None, SpeculationConfig(), torch.device("cpu")), slots, **kwargs)


def job(name: str, prompt: list[int], max_tokens: int, events: list | None = None) -> Job:
    def on_delta(j: Job, delta) -> None:
        if events is not None and delta.tokens:
            events.append(("token", j.id))

    return Job(name, list(prompt), GREEDY, max_tokens=max_tokens, ignore_eos=True, on_delta=on_delta)


def count_pieces(target: Model, monkeypatch, events: list, then=None) -> None:
    """Record every prefill piece (Batch decodes prompts through Model.decode, steps through decode_multi)."""
    decode = target.decode

    def counted(tokens, start_pos, logits_rows, seq_id=0):
        out = decode(tokens, start_pos, logits_rows, seq_id)
        events.append(("piece", len(tokens)))
        if then:
            then()
        return out

    monkeypatch.setattr(target, "decode", counted)


def alone(target: Model, prompt: list[int], max_tokens: int, **kwargs) -> list[int]:
    batch = new_batch(target, 1, **kwargs)
    one = job("alone", prompt, max_tokens)
    batch.submit(one)
    run_jobs(batch)
    return one.run.tokens


def start_streaming(batch: Batch, first: Job) -> None:
    batch.submit(first)
    while len(first.run.tokens if first.run else ()) < 2:
        batch.pump()


def test_pieces_tile_the_prompt_within_model_prefill_chunks():
    for chunk in (16, 64, PREFILL_CHUNK, 200, 512, 10**9):
        for total in (1, 63, 64, 65, 129, 300, 511, 512, 513, 1063, LONG):
            done, pieces = 0, []
            while done < total:
                pieces.append(prefill_piece(done, total, chunk, 512))
                assert done // 512 == (done + pieces[-1] - 1) // 512  # never across a 512-row chunk
                done += pieces[-1]
            assert done == total
            assert max(pieces) <= max(min(chunk, 512), MIN_PIECE + 63), (chunk, total, pieces)
            for i, piece in enumerate(pieces):
                block_left = min(total, (sum(pieces[:i]) // 512 + 1) * 512) - sum(pieces[:i])
                if piece < block_left:  # not its block's last: whole kernels' worth, on the 16-row grid
                    assert piece % 16 == 0 and piece >= MIN_PIECE and block_left - piece >= MIN_PIECE
            if chunk >= 512:  # Model.prefill's own chunks
                assert pieces == [512] * ((total - 1) // 512) + [total - 512 * ((total - 1) // 512)]


def test_a_streaming_job_takes_a_step_between_every_piece_of_a_long_prompt(target, prompts, monkeypatch):
    """The issue's case: one client streams while another sends a 3,000-token prompt. The long prompt is
    prefilled in pieces of at most PREFILL_CHUNK rows, and the first job gets a token between every two of them
    (before, the whole prompt went in one pump: six 512-row decodes in a row). Both answers are the tokens each
    job gets alone (the streaming one up to near-ties: greedy_check)."""
    short, long = prompts
    events: list = []
    batch = new_batch(target)
    first, second = job("first", short, 48, events), job("second", long, 8)
    start_streaming(batch, first)
    count_pieces(target, monkeypatch, events)
    batch.submit(second)
    while second.run is None or not second.run.tokens:
        batch.pump()
    monkeypatch.undo()
    run_jobs(batch)
    pieces = [i for i, (kind, _) in enumerate(events) if kind == "piece"]
    assert sum(events[i][1] for i in pieces) == LONG
    assert max(events[i][1] for i in pieces) <= PREFILL_CHUNK and len(pieces) >= LONG // PREFILL_CHUNK
    for a, b in zip(pieces, pieces[1:]):
        assert ("token", "first") in events[a + 1 : b], (a, b, events[a : b + 1])
    assert first.finish_reason == second.finish_reason == "length"
    assert second.run.stats.prefill_s == second.run.stats.ttft_s > 0
    # Each answer is its model's own: the argmax of its prefix, up to a near-tie. Not always byte for byte the
    # answer it gets alone: with the other prompt's cells in the cache, attention rounds differently on some CPUs
    # (the first answer parted from its lone one at token 28 of 48 on one, at a near-tie).
    assert_self_consistent(target, short, first.run.tokens, "first")
    assert second.run.tokens == alone(target, long, 8)  # its logits included: pieces on Model.prefill's kernels


def test_a_job_cancelled_in_its_prefill_frees_its_slot_within_one_piece(target, prompts, monkeypatch):
    """A client that hangs up while its prompt is prefilled (the server sets the job's cancel flag from another
    thread, here during the second piece): no piece is decoded after the one under way, the sequence id is free
    and empty at the next pump, and the streaming job goes on."""
    short, long = prompts
    events: list = []
    batch = new_batch(target)
    first, second = job("first", short, 24, events), job("second", long, 8)
    start_streaming(batch, first)
    done: list = []
    second.on_done = done.append

    def hang_up_in_the_second_piece() -> None:
        if sum(kind == "piece" for kind, _ in events) == 2:
            second.cancel.set()

    count_pieces(target, monkeypatch, events, then=hang_up_in_the_second_piece)
    batch.submit(second)
    while not second.cancel.is_set():
        batch.pump()
    slot = second.run.slot
    batch.pump()
    assert [kind for kind, _ in events].count("piece") == 2  # none after the cancel
    assert done == [second] and second.finish_reason == "cancelled" and not second.run.tokens
    assert slot in batch.kv.free and batch.filling is None and batch.running == 1
    assert target.next_position(slot) == 0  # its cells are gone
    monkeypatch.undo()
    run_jobs(batch)
    assert first.finish_reason == "length" and first.run.tokens == alone(target, short, 24)


@pytest.mark.parametrize("length", [300, 700, 1063])
def test_a_lone_job_gets_the_same_tokens_whatever_the_chunk(target, prompts, length):
    """The chat's answers while serving (a batch of one): pieces leave every row as Model.prefill's chunks compute
    it, so chunking changes no token, nor the first one's logits, where a short last piece would have."""
    prompt = prompts[1][:length]
    assert alone(target, prompt, 12) == alone(target, prompt, 12, prefill_chunk=10**9)
