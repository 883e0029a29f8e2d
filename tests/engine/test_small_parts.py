"""Stop strings, UTF-8 streaming, GGUF header checks and the draft-length policy."""

import struct

import pytest

from engine.decoding.acceptance import Acceptance, prior_acceptance
from engine.decoding.calibration import calibration_sizes
from engine.decoding.draft_planner import REALISM_HORIZON, REALISM_RANGE, DraftPlanner
from engine.decoding.speculation_config import SpeculationConfig
from engine.decoding.step_costs import StepCosts
from engine.decoding.stop_strings import StopMatcher
from engine.decoding.text_stream import TextStream
from engine.errors import InvalidSettingError, ModelFileError
from engine.modelfiles.gguf_header import read_gguf_header


def test_text_stream_never_splits_a_character():
    data = "héllo → 世界 🎉".encode()
    stream = TextStream()
    parts = [stream.push(data[i : i + 1]) for i in range(len(data))] + [stream.flush()]
    assert all("\ufffd" not in p for p in parts)
    assert "".join(parts) == "héllo → 世界 🎉"


def test_stop_matcher_holds_back_a_partial_stop_and_cuts_at_a_full_one():
    m = StopMatcher(["\nUser:"])
    shown, stopped = m.push([("Hello", False), ("\nUs", True)])
    assert "".join(t for t, _ in shown) == "Hello" and not stopped
    shown, stopped = m.push([("er: more", False)])
    assert shown == [] and stopped
    m = StopMatcher(["\nUser:"])
    shown, stopped = m.push([("a\nU", False)])
    shown2, stopped2 = m.push([("nicode", False)])
    assert "".join(t for t, _ in shown + shown2) == "a\nUnicode" and not stopped2


def _gguf(tmp_path, magic=b"GGUF", version=3, tensors=5, size=4096):
    path = tmp_path / "m.gguf"
    path.write_bytes(struct.pack("<4sIQQ", magic, version, tensors, 10).ljust(size, b"\0"))
    return path


def test_gguf_header_checks(tmp_path):
    assert read_gguf_header(_gguf(tmp_path)).tensor_count == 5
    with pytest.raises(ModelFileError, match="not found"):
        read_gguf_header(tmp_path / "missing.gguf")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        read_gguf_header(_gguf(tmp_path, magic=b"PK\x03\x04"))
    with pytest.raises(ModelFileError, match="version"):
        read_gguf_header(_gguf(tmp_path, version=99))
    with pytest.raises(ModelFileError, match="truncated"):
        read_gguf_header(_gguf(tmp_path, size=100))
    (tmp_path / "short.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelFileError, match="too short"):
        read_gguf_header(tmp_path / "short.gguf")


FEATURE = (16, True)  # one lookup feature: every proposal alike


def _policy(accept_rate: float, row_cost: float, steps: int = 200) -> DraftPlanner:
    """Feed a planner a synthetic machine: step time 10 ms × (1 + row_cost·(rows−1))."""
    import random

    rng = random.Random(0)
    planner = DraftPlanner(SpeculationConfig(max_draft=16), costly_proposer=False)
    for _ in range(steps):
        k = planner.plan([FEATURE], [16]).lengths[0]
        planner.record_step(k + 1, k, 0.010 * (1 + row_cost * k))
        if k:
            kept = _kept_run(rng, accept_rate, k)
            planner.acceptance.record(FEATURE, k, kept)
            if kept == k:  # the step's own token against the proposal's next one (drafting.record_tables)
                planner.acceptance.record_slot(FEATURE, k, rng.random() < accept_rate)
        else:  # what the loop's shadow scoring feeds it while speculation is off
            planner.acceptance.record(FEATURE, 16, _kept_run(rng, accept_rate, 16))
    return planner


def _kept_run(rng, accept_rate: float, slots: int) -> int:
    """How many of `slots` draft tokens are kept in a row when each is kept with accept_rate."""
    kept = 0
    while kept < slots and rng.random() < accept_rate:
        kept += 1
    return kept


def _choose(planner: DraftPlanner) -> int:
    return planner.plan([FEATURE], [16]).lengths[0]


def _rate(accept_rate: float, row_cost: float, k: int) -> float:
    return sum(accept_rate**j for j in range(k + 1)) / (1 + row_cost * k)


def _best_k(accept_rate: float, row_cost: float, max_draft: int = 16) -> int:
    return max(range(max_draft + 1), key=lambda k: _rate(accept_rate, row_cost, k))


@pytest.mark.parametrize("accept_rate,row_cost", [(0.95, 0.35), (0.99, 0.35), (0.6, 0.02), (0.8, 0.1)])
def test_policy_finds_the_fastest_draft_length(accept_rate, row_cost):
    best = _best_k(accept_rate, row_cost)
    chosen = _choose(_policy(accept_rate, row_cost))
    assert best > 0 and chosen > 0
    # The rate curve is flat near its peak: what counts is the speed the choice achieves.
    assert _rate(accept_rate, row_cost, chosen) >= 0.9 * _rate(accept_rate, row_cost, best), (chosen, best)


def test_policy_stops_speculating_when_it_does_not_pay():
    assert _best_k(0.2, 0.35) == 0
    assert _choose(_policy(0.2, 0.35)) == 0


def test_policy_config_is_validated():
    with pytest.raises(InvalidSettingError):
        SpeculationConfig(max_draft=-1)
    with pytest.raises(InvalidSettingError):
        SpeculationConfig(max_draft=4, min_draft=9)
    assert DraftPlanner(SpeculationConfig(max_draft=5, adaptive=False), False).plan([FEATURE], [9]).lengths == [5]


def test_step_costs_follow_recent_medians_and_notice_a_busy_machine():
    costs = StepCosts()
    costs.take_calibration({1: 0.010, 2: 0.020, 8: 0.040, 16: 0.050})
    assert costs.seconds(16) == pytest.approx(0.050) and costs.seconds(12) == pytest.approx(0.045)
    for _ in range(3):
        costs.record(1, 0.010)
    costs.record(1, 0.500)  # one outlier (a page fault, a busy core) steers nothing
    assert costs.seconds(16) == pytest.approx(0.050) and not costs.contended
    for _ in range(9):  # the machine stays slow: every size is rescaled, none is stale
        costs.record(1, 0.030)
    assert costs.contended and costs.seconds(16) == pytest.approx(0.150)


def test_a_growing_context_and_dear_drafted_steps_are_not_taken_for_a_busy_machine():
    """Measured step times of SmolLM2 here (flash attention on): one row 9.1 ms in an empty cache, 14 ms at
    position 230, 27.3 ms at 800; 24 rows 112.8 ms empty, 445 ms at 800. None of it is another process."""
    from engine.decoding.step_costs import QUIET_MEMORY

    costs = StepCosts()
    costs.take_calibration({1: 0.0091, 24: 0.1128})
    for one_row in [0.014] * 10 + [0.016] * 10:  # live, above calibration from the first step
        costs.record(1, one_row)
    assert not costs.contended
    for _ in range(9):  # an answer that copies: wide drafts, ever dearer
        costs.record(24, 0.445, drafted=True)
    assert not costs.contended
    for i in range(QUIET_MEMORY * 2):  # the context grows plain step by plain step, 14 ms to 27 ms
        costs.record(1, 0.014 + 0.013 * i / (QUIET_MEMORY * 2))
        assert not costs.contended
    for _ in range(5):  # then another process takes a core: 3x
        costs.record(1, 0.081)
    assert costs.contended


def test_drafted_steps_dearer_than_calibrated_are_priced_as_measured_and_plain_steps_keep_theirs():
    costs = StepCosts()
    costs.take_calibration({1: 0.010, 2: 0.020, 8: 0.040})
    for _ in range(5):
        costs.record(1, 0.010)
    for _ in range(2):
        costs.record(8, 0.048, drafted=True)
    assert costs.seconds(8, drafted=True) == pytest.approx(0.040)  # two are not yet evidence
    costs.record(8, 0.048, drafted=True)  # a third: drafted steps cost 20% over their base
    assert costs.seconds(8, drafted=True) == pytest.approx(0.048)
    assert costs.seconds(2, drafted=True) == pytest.approx(0.024)
    assert costs.seconds(1) == pytest.approx(0.010) and costs.seconds(8) == pytest.approx(0.040)
    for _ in range(9):
        costs.record(8, 0.400, drafted=True)  # however dear they turn, the factor stays in its range
    assert costs.drafted_factor == pytest.approx(1.5)


def test_the_planner_stops_drafting_once_drafted_steps_prove_dearer_than_calibrated():
    """Calibrated, each draft row costs 10% of a step; live, 35%. With 30% acceptance a draft pays at the
    first price and not at the second: the planner drafts at first, then stops."""
    import random

    rng = random.Random(1)
    planner = DraftPlanner(SpeculationConfig(max_draft=16), costly_proposer=False)
    planner.steps.take_calibration({rows: 0.010 * (1 + 0.1 * (rows - 1)) for rows in range(1, 18)})
    planner.record_step(1, 0, 0.010)
    for _ in range(100):
        planner.acceptance.record(FEATURE, 16, _kept_run(rng, 0.3, 16))
    assert _choose(planner) > 0
    drafted = 0
    for _ in range(200):
        k = _choose(planner)
        planner.record_step(k + 1, k, 0.010 * (1 + 0.35 * k))
        planner.acceptance.record(FEATURE, k or 16, _kept_run(rng, 0.3, k or 16))  # a shadow's 16 when not drafting
        drafted += k > 0
    assert _choose(planner) == 0 and drafted < 20


def test_calibration_times_every_single_sequence_size_then_every_eighth():
    assert calibration_sizes(5) == [1, 2, 3, 4, 5]
    assert calibration_sizes(33) == list(range(1, 18)) + [24, 32, 33]
    assert calibration_sizes(264) == list(range(1, 18)) + [24, 32, 40, 48, 56, 64, 96, 128, 160, 192, 224, 256, 264]


def test_calibration_times_sizes_in_rounds_and_keeps_each_ones_fastest():
    """Each size is timed once per round (not twice in a row: this VM's speed wanders over seconds), the
    fastest kept; sizes wider than one sequence's verify are timed in the first round only."""
    from engine.decoding.calibration import (
        CALIBRATION_REPEATED_UP_TO,
        CALIBRATION_REPEATS,
        CALIBRATION_WARMUP,
        time_steps,
    )

    class SlowThenFast:  # every decode of round 1 takes 2 ms a row, of later rounds 1 ms a row
        def __init__(self):
            self.now, self.decoded = 0.0, []
            self.threads, self.step_timings = 2, {}

        def decode_multi(self, tokens, positions, seq_ids, want_logits):
            self.decoded.append(len(tokens))
            timed_before = len(self.decoded) - CALIBRATION_WARMUP - 1  # the warm-up and the widest, untimed
            self.now += len(tokens) * (0.002 if timed_before <= len(sizes) else 0.001)

        def forget_from(self, pos, seq_id=0):
            pass

    sizes = [1, 2, 3, CALIBRATION_REPEATED_UP_TO + 5]
    target = SlowThenFast()
    curve = time_steps(target, 0, 0, 7, sizes, clock=lambda: target.now)
    timed = target.decoded[CALIBRATION_WARMUP + 1 :]
    assert timed == sizes + sizes[:-1] * (CALIBRATION_REPEATS - 1)  # rounds; the widest once
    assert curve == pytest.approx({1: 0.001, 2: 0.002, 3: 0.003, sizes[-1]: 0.002 * sizes[-1]})
    # Kept with the model: the same sizes again time nothing; a new size is timed alone; other threads afresh.
    decoded = len(target.decoded)
    assert time_steps(target, 0, 0, 7, sizes[:2], clock=lambda: target.now) == pytest.approx({1: 0.001, 2: 0.002})
    assert len(target.decoded) == decoded
    time_steps(target, 0, 0, 7, [1, 6], clock=lambda: target.now)
    assert set(target.decoded[decoded + CALIBRATION_WARMUP :]) == {6}
    target.threads = 1
    time_steps(target, 0, 0, 7, [1], clock=lambda: target.now)
    assert (1, 1) in target.step_timings and (2, 1) in target.step_timings


@pytest.mark.slow
def test_step_timings_are_kept_per_file_and_settings_for_a_day(tmp_path, monkeypatch):
    """A reload of the same file with the same settings, or another context size, finds the sizes timed before,
    in this process and, from the cache folder, in the next one; another batch size, a changed file, a day-old
    or a damaged cache start empty, and saving drops damaged entries."""
    import json

    from engine.decoding import step_timings
    from engine.decoding.runtime import LoadSettings, Model
    from engine.modelfiles.embedded import embedded_model_path

    model_path = embedded_model_path()  # SmolLM2: its 49k vocabulary loads 5x faster than Gemma's 262k
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    step_timings.forget()  # as at a first start (the real cache folder is untouched)
    first = Model(model_path, LoadSettings(n_ctx=512), vocab_only=True)
    first.step_timings[(2, 1)] = 0.02
    step_timings.save()
    again = Model(model_path, LoadSettings(n_ctx=512), vocab_only=True)
    longer = Model(model_path, LoadSettings(n_ctx=4096), vocab_only=True)
    wider = Model(model_path, LoadSettings(n_ctx=512, n_batch=256), vocab_only=True)
    assert again.step_timings == longer.step_timings == {(2, 1): 0.02} and wider.step_timings == {}
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(b"GGUF")
    assert step_timings.table_for(copy, -1, 512, None) == {}

    saved = tmp_path / "cache" / step_timings.FILE_NAME
    kept = saved.read_text()
    step_timings._tables.clear()  # the next launch: only the cache folder remembers
    assert Model(model_path, LoadSettings(n_ctx=512), vocab_only=True).step_timings == {(2, 1): 0.02}
    for text in (
        json.dumps(
            {k: {**v, "measured_at": v["measured_at"] - step_timings.MAX_AGE_S} for k, v in json.loads(kept).items()}
        ),  # a day old
        kept.replace("0.02", '"fast"'),
        "{not json",
        "[]",
    ):
        saved.write_text(text)
        step_timings._tables.clear()
        assert Model(model_path, LoadSettings(n_ctx=512), vocab_only=True).step_timings == {}, text
    saved.write_text(json.dumps({"someone else's": 5, "odd": {"measured_at": "today"}}))  # damaged entries ...
    step_timings._tables.clear()
    step_timings.table_for(model_path, -1, 512, None, first.repacked_weights)[(2, 1)] = 0.02
    step_timings.save()  # ... are dropped when the next timings are saved, not a crash
    assert list(json.loads(saved.read_text())) == list(json.loads(kept))
    step_timings.forget()  # the made-up timings go; later loads read the real cache folder again


def test_step_timings_timed_in_a_busy_spell_are_not_kept(tmp_path, monkeypatch):
    """A table whose steps cannot be (2 rows dearer than two one-row steps by far, or far cheaper than one) was timed
    while something else ran: it is neither saved nor taken from the cache folder, so the next start times again."""
    import json

    from engine.decoding import step_timings
    from engine.modelfiles.embedded import embedded_model_path

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    step_timings.forget()
    path = embedded_model_path()
    table = step_timings.table_for(path, -1, 512, None)
    table.update(
        {(2, 1): 0.048, (2, 2): 0.588, (2, 3): 0.061, (1, 64): 0.4}
    )  # the busy spell, as this VM's cache had it
    step_timings.save()
    assert (
        not (tmp_path / "cache" / step_timings.FILE_NAME).exists()
        or json.loads((tmp_path / "cache" / step_timings.FILE_NAME).read_text()) == {}
    )
    assert step_timings.plausible(
        {(2, 1): 0.048, (2, 2): 0.09, (2, 3): 0.061, (1, 64): 0.4}
    )  # no 1-row at 1 thread yet
    assert not step_timings.plausible({(2, 1): 0.048, (2, 2): 0.02})
    saved = {"measured_at": __import__("time").time(), "seconds": {"2,1": 0.048, "2,2": 0.588}}
    assert step_timings._saved_table(saved)[1] == {}
    step_timings.forget()


def test_step_timings_of_one_build_are_not_another_builds(tmp_path, monkeypatch):
    """A Vulkan build of the same llama-cpp-python version, sharing the cache folder, starts its own table rather than
    planning with the CPU build's step costs. The GPU device is a stand-in (none here)."""
    from engine import hardware
    from engine.decoding import step_timings
    from engine.modelfiles.embedded import embedded_model_path

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    step_timings.forget()
    path = embedded_model_path()
    step_timings.table_for(path, -1, 512, None)[(2, 1)] = 0.02
    step_timings.save()
    step_timings._tables.clear()
    assert step_timings.table_for(path, -1, 512, None) == {(2, 1): 0.02}  # the same build: kept
    gpu = hardware.Device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", True, 0)
    monkeypatch.setattr(step_timings, "devices", lambda: [gpu])
    assert step_timings.table_for(path, -1, 512, None) == {}
    step_timings.forget()


def test_acceptance_keeps_its_sums_with_its_tables():
    """The pooled prior reads each feature's totals, kept current as slots are recorded and faded; and
    E(k) stops where a further slot adds under NEGLIGIBLE_TOKENS."""
    table = Acceptance(16)
    for step in range(60):
        table.record((4, step % 2 == 0), 1 + step % 9, step % 5)
        table.record((12, True), 16, 16 if step % 3 else 2)
        if step % 20 == 19:
            table.fade()
    for feature in table._tried:
        assert table._sums[feature] == pytest.approx([sum(table._tried[feature]), sum(table._kept[feature])])
    never = Acceptance(16)
    for _ in range(200):
        never.record((1, False), 4, 0)
    assert len(never.expected_tokens((1, False))) < 17 <= len(table.expected_tokens((12, True))) + 0
    assert len(table.expected_tokens((12, True), slots=5)) == 6


def test_borrowed_evidence_only_lowers_a_features_prior():
    """An unseen feature borrows from longer matches: their misses lower its prior (a table's long matches
    fail, so its short ones will), but their hits do not raise it (a copy that held says nothing of a
    2-token coincidence: Gemma 3's table answer drafted on such borrowed confidence and lost to plain)."""
    holds, fails = Acceptance(16), Acceptance(16)
    for _ in range(50):
        holds.record((16, True), 16, 16)
        fails.record((16, True), 16, 0)
    short = (2, True)
    assert holds.mean_acceptance(short)[0] == pytest.approx(prior_acceptance(short))
    assert fails.mean_acceptance(short)[0] < prior_acceptance(short) / 2
    assert holds.mean_acceptance((16, True))[0] > 0.95  # its own evidence still counts in full


def test_a_bet_counts_on_less_than_the_estimate_the_less_it_rests_on():
    """The optimizer's curse: bets go where estimates run high, and an estimate of few observations runs high by
    chance, so a bet counts on the estimate less its uncertainty. One miss in three and fifteen in forty-five
    estimate alike; the bet on the first counts on much less than the one on the well-seen slot. An unseen feature's
    prior is no one's luck: a bet counts on it whole (a fresh chat's first copy drafts)."""
    few, many = Acceptance(4), Acceptance(4)
    for table, n in ((few, 1), (many, 15)):
        for _ in range(n):
            for kept in (True, False, True):
                table.record_slot((4, False), 0, kept)
    mean_few, mean_many = few.mean_acceptance((4, False))[0], many.mean_acceptance((4, False))[0]
    assert mean_few == pytest.approx(mean_many, abs=0.05)
    bet_few, bet_many = few.slot_acceptance((4, False))[0], many.slot_acceptance((4, False))[0]
    assert bet_few < mean_few - 0.15 and mean_many - 0.12 < bet_many < mean_many and bet_few < bet_many - 0.05
    assert few.expected_tokens((4, False))[1] == pytest.approx(1 + bet_few)  # what the planner prices drafts with
    unseen = few.slot_acceptance((8, False))[0]  # no observations: the prior, which no noise has raised
    assert unseen == pytest.approx(few.mean_acceptance((8, False))[0]) == pytest.approx(prior_acceptance((8, False)))


def test_a_low_realism_expires_so_drafting_can_resume():
    """Misses lower the planner's realism; if that alone stopped drafting for good, no later outcome could
    raise it again. Outcomes older than REALISM_HORIZON steps no longer count."""
    planner = DraftPlanner(SpeculationConfig(max_draft=16), costly_proposer=False)
    planner.steps.take_calibration({1: 0.010, 8: 0.020, 16: 0.030})
    for _ in range(6):  # six drafting steps that kept nothing of what was predicted
        planner._predicted = 5.0
        planner.record_step(8, 7, 0.020)
        planner.record_outcome(0)
    assert planner.realism == REALISM_RANGE[0]
    for _ in range(REALISM_HORIZON + 1):  # plain steps: nothing new about drafting
        planner.record_step(1, 0, 0.010)
    assert planner.realism == 1.0


def test_settled_shadows_lift_a_low_realism_back_to_one_and_no_further():
    """Proposals scored while not drafting count towards a realism below 1 (it stops drafting, so drafted
    outcomes alone could not raise it), but never lift it past 1 nor lower a realism the drafts made."""

    def planner_with(drafted: list[tuple[float, int]], shadows: list[tuple[float, int]]) -> DraftPlanner:
        planner = DraftPlanner(SpeculationConfig(max_draft=16), costly_proposer=False)
        planner.steps.take_calibration({1: 0.010, 8: 0.020, 16: 0.030})
        for predicted, kept in drafted:
            planner._predicted = predicted
            planner.record_step(8, 7, 0.020)
            planner.record_outcome(kept)
        for predicted, kept in shadows:
            planner.record_shadow_outcome(predicted, kept)
        return planner

    assert planner_with([(5.0, 1)] * 4, []).realism == pytest.approx(0.2)
    assert planner_with([(5.0, 1)] * 4, [(2.0, 4)] * 2).realism == pytest.approx((4 + 8) / (20 + 4))
    assert planner_with([(5.0, 1)] * 4, [(2.0, 8)] * 4).realism == 1.0  # held: lifted to 1, not past it
    assert planner_with([(2.0, 2)] * 8, [(2.0, 0)] * 8).realism == 1.0  # failed: the drafts' own 1 stands
    assert planner_with([(2.0, 3)] * 8, [(2.0, 0)] * 8).realism > 1.0


def test_a_sequence_that_copies_drafts_though_the_others_do_not():
    """The shared acceptance table is every sequence's; one answer copying its prompt while the rest of the
    batch writes freely is judged by its own drafts, with the shared table as the prior."""
    planner = DraftPlanner(SpeculationConfig(max_draft=16), costly_proposer=False)
    planner.steps.take_calibration({1: 0.010, 8: 0.012, 16: 0.014})
    for _ in range(40):
        planner.acceptance.record(FEATURE, 8, 0)  # everyone else's drafts were rejected at once
    copying, fresh = Acceptance(16), Acceptance(16)
    for _ in range(20):
        copying.record(FEATURE, 8, 8)  # this answer's were kept whole
    assert planner.plan([FEATURE], [16], [fresh]).lengths == [0]
    assert planner.plan([FEATURE], [16], [copying]).lengths[0] >= 4


@pytest.mark.parametrize("amx", [True, False])
def test_no_weights_go_to_amx_kernels_which_crash(monkeypatch, amx, gemma_path):
    """On a CPU whose llama.cpp build has AMX kernels, Gemma 3's first multi-row step segfaulted in them (an
    Intel Xeon with AMX_INT8): SpecChat then loads without extra buffer types and hands the repackable weights to
    CPU_REPACK by name (repack.py); llama-server beside it can only run with --no-repack. Elsewhere llama.cpp
    chooses, and nothing is counted."""
    import llama_cpp

    from engine import hardware
    from engine.decoding import repack
    from engine.decoding.runtime import model_params
    from engine.measure.versus_server import same_kernels

    features = b"CPU : AVX2 = 1 | AVX512 = 1 | " + (b"AMX_INT8 = 1 | " if amx else b"") + b"REPACK = 1 | "
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: features)
    hardware.cpu_uses_amx.cache_clear()
    try:
        assert model_params()[0].use_extra_bufts is not amx
        assert ("--no-repack" in same_kernels()) is amx
        params, repacked = model_params(gemma_path)
        if not amx:
            assert params.use_extra_bufts and repacked == -1 and not params.tensor_buft_overrides
        elif repack.cpu_repack_buffer_type() is not None:
            assert repacked == 27 and params.tensor_buft_overrides  # Gemma 3 270M's Q4_K matrices
    finally:
        hardware.cpu_uses_amx.cache_clear()


@pytest.mark.parametrize(
    "asked, kind, server_flags",
    [(None, "AUTO", []), (True, "ENABLED", ["--flash-attn", "on"]), (False, "DISABLED", ["--flash-attn", "off"])],
)
def test_flash_attention_is_llama_cpps_choice_unless_asked(asked, kind, server_flags):
    """Off is a Settings choice (faster on a CPU at long contexts, less often bit-identical verify rows), never
    the default; llama-server beside SpecChat is given the same choice."""
    import llama_cpp

    from engine.decoding import runtime
    from engine.measure import versus_server

    for gpu_layers in (-1, 0):
        settings = runtime.LoadSettings(n_gpu_layers=gpu_layers, flash_attention=asked)
        assert runtime.flash_attention_type(settings) == getattr(llama_cpp, f"LLAMA_FLASH_ATTN_TYPE_{kind}")
    flags = versus_server.same_kernels(asked)
    assert [f for f in flags if f != "--no-repack"] == server_flags


@pytest.mark.slow
def test_a_model_collected_while_another_thread_loads_is_freed_by_the_next_load(gemma_path):
    """The garbage collector never frees a model while another thread loads or frees one (that crashed the
    process once); the model waits for the next load or close, which frees it."""
    import gc
    import threading

    from engine.decoding import runtime
    from engine.decoding.runtime import LoadSettings, Model

    model = Model(gemma_path, LoadSettings(n_gpu_layers=0), vocab_only=True)
    holding, release = threading.Event(), threading.Event()

    def loading_elsewhere():
        with runtime._lifecycle:
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=loading_elsewhere)
    thread.start()
    assert holding.wait(30)
    del model
    gc.collect()
    assert len(runtime._unfreed) == 1 and runtime._unfreed[0]._model  # left for later, not freed meanwhile
    release.set()
    thread.join()
    Model(gemma_path, LoadSettings(n_gpu_layers=0), vocab_only=True).close()
    assert runtime._unfreed == []


def test_a_draft_kept_whole_also_shows_the_slot_after_it():
    """A lookup draft cut to the plan's k tokens and kept whole: the step's own token is what the proposal's next
    token would have been verified against, so slot k is observed too (hit or miss). A draft not kept whole says
    nothing of it."""
    import torch

    from engine.decoding.drafting import FreeDrafting, lookup_feature
    from engine.decoding.proposers.base import Proposal
    from engine.decoding.proposers.lookup import LookupProposer
    from engine.decoding.sampling import SamplingParams
    from engine.decoding.stats import GenerationStats
    from engine.decoding.step import SequenceState
    from engine.decoding.verifier import Verdict, Verifier

    planner = DraftPlanner(SpeculationConfig(max_draft=8), costly_proposer=False)
    drafting = FreeDrafting(LookupProposer(), planner, None, planner.config, lambda: 0.0)
    seq = SequenceState(
        0, [1, 2, 3], Verifier(SamplingParams(temperature=0.0), torch.device("cpu"), 0), GenerationStats()
    )
    f = lookup_feature(6, False)
    cut = Proposal([7, 8], None, 6, beyond=9)
    for verdict in (
        Verdict(2, 9),  # kept whole, and the target wrote 9: slot 2 a hit
        Verdict(2, 5),  # kept whole, the target wrote 5: slot 2 a miss
        Verdict(1, 5),
    ):  # not kept whole: slot 2 not reached
        seq.draft.continuing = False  # (one feature throughout)
        drafting.record_tables([seq], [cut], [verdict])
    for table in (planner.acceptance, seq.draft.acceptance):
        assert table._seen[f][:3] == [3.0, 3.0, 2.0]
        assert table.mean_acceptance(f)[2] < table.mean_acceptance(f)[0]  # one hit and one miss, against 3 of 3
