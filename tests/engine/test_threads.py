"""ThreadTuner: fewer threads when a busy machine makes them faster, the full count again when not; and never more
threads than the CPUs the process may use."""

import os
import subprocess
import sys

import pytest

from engine.decoding.runtime import LoadSettings
from engine.decoding.threads import FIRST_QUIET_TRIAL_AFTER, QUIET_TRIAL_EVERY, RETRY_EVERY, TRIAL_STEPS, ThreadTuner


def run(
    tuner: ThreadTuner, cost_by_threads: dict[int, float], contended: bool, steps: int, drafted: bool = False
) -> list[int]:
    switches = []
    for _ in range(steps):
        switch = tuner.record(cost_by_threads[tuner.current], contended, drafted)
        if switch is not None:
            switches.append(switch)
    return switches


def test_a_busy_machine_gets_half_the_threads_when_that_is_faster():
    tuner = ThreadTuner(2)
    busy = {2: 0.026, 1: 0.011}  # measured here with one busy process: 2 threads 38.8 tok/s, 1 thread 93.0
    assert run(tuner, busy, contended=True, steps=TRIAL_STEPS * 3) == [1]
    assert tuner.current == 1
    # The other process goes away: the periodic retry of the full count finds it faster and keeps it.
    quiet = {2: 0.010, 1: 0.017}
    assert run(tuner, quiet, contended=False, steps=RETRY_EVERY + TRIAL_STEPS) == [2]
    assert tuner.current == 2


def test_fewer_threads_that_are_not_faster_are_given_back():
    tuner = ThreadTuner(2)
    slow_anyway = {2: 0.020, 1: 0.034}  # slow for another reason (a long context): halving does not help
    assert run(tuner, slow_anyway, contended=True, steps=TRIAL_STEPS * 2) == [1, 2]
    assert tuner.current == 2


def test_a_trial_that_is_only_somewhat_faster_is_given_back():
    """A slow spell of the VM that ends as the trial begins makes fewer threads look faster than they are:
    only a clear gain (a busy core's is 2.4x) keeps them."""
    tuner = ThreadTuner(2)
    spell = {2: 0.012, 1: 0.0095}  # 2 threads in a slow spell, 1 thread after it: 0.79x
    assert run(tuner, spell, contended=True, steps=TRIAL_STEPS * 2) == [1, 2]


def test_one_thread_is_left_alone():
    assert run(ThreadTuner(1), {1: 0.05}, contended=True, steps=50) == []


def test_a_machine_busy_from_the_start_is_found_by_an_early_trial():
    """Steps that were slow from the first on never look slower than themselves, so the contention signal
    never fires; one early trial of half the threads finds them faster all the same."""
    tuner = ThreadTuner(2)
    busy = {2: 0.026, 1: 0.011}
    assert run(tuner, busy, contended=False, steps=FIRST_QUIET_TRIAL_AFTER + TRIAL_STEPS) == [1]
    # On a quiet machine the trial is given back, and not repeated for QUIET_TRIAL_EVERY steps.
    tuner = ThreadTuner(2)
    quiet = {2: 0.010, 1: 0.013}
    steps = FIRST_QUIET_TRIAL_AFTER + TRIAL_STEPS + QUIET_TRIAL_EVERY - 1
    assert run(tuner, quiet, contended=False, steps=steps) == [1, 2]


def test_a_trial_without_contention_waits_for_a_plain_step():
    """1 thread verifies many rows far slower than 2, so the early trial is not made while every step
    verifies drafts (an answer copying its prompt), only at the first plain step after."""
    tuner = ThreadTuner(2)
    quiet = {2: 0.010, 1: 0.013}
    assert run(tuner, quiet, contended=False, steps=FIRST_QUIET_TRIAL_AFTER * 4, drafted=True) == []
    assert run(tuner, quiet, contended=False, steps=1) == [1]
    # Contention is not kept waiting: halving may be what a busy machine needs most while drafting.
    tuner = ThreadTuner(2)
    assert run(tuner, {2: 0.026, 1: 0.011}, contended=True, steps=TRIAL_STEPS, drafted=True) == [1]


def test_a_trial_without_contention_ends_before_a_step_that_drafts():
    """The quiet trial's steps at 1 thread were meant to be plain ones; a copy that starts drafting during it
    would verify wide steps at half the threads (SmolLM2: 8 of an answer's 34 steps, 1.6 s of its 4.2), so the
    trial ends first, unjudged. A trial made for contention goes on: fewer threads may be what drafting needs."""
    tuner = ThreadTuner(2)
    quiet = {2: 0.010, 1: 0.013}
    assert run(tuner, quiet, contended=False, steps=FIRST_QUIET_TRIAL_AFTER) == [1]
    assert tuner.before_step(drafting=False) is None
    assert tuner.before_step(drafting=True) == 2
    assert tuner.current == 2
    # Not tried again at once: the next quiet trial is QUIET_TRIAL_EVERY steps away.
    assert run(tuner, quiet, contended=False, steps=QUIET_TRIAL_EVERY - 1) == []
    tuner = ThreadTuner(2)
    assert run(tuner, {2: 0.026, 1: 0.011}, contended=True, steps=TRIAL_STEPS) == [1]
    assert tuner.before_step(drafting=True) is None
    assert tuner.current == 1


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs CPU affinity and two CPUs"
)
def test_never_more_threads_than_the_cpus_this_process_may_use():
    """Under `taskset -c 0` (or a container's cpuset) two llama.cpp threads would share one CPU and wait for each
    other at every graph node: the engine runs one, whatever the setting asks."""
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from engine.decoding.runtime import LoadSettings; from engine.hardware import physical_cores; "
        "print(LoadSettings(threads=2).resolved_threads(), LoadSettings().resolved_threads(), physical_cores())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "1", "1"]
    assert LoadSettings(threads=2).resolved_threads() == 2  # this process may use both
