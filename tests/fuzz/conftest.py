"""The fuzzer's Hypothesis profile, seed and watchdog wiring (issue 63).

Every fuzz test takes its settings from the "specchat-fuzz" profile (settings.get_profile), with a fixed, modest
max_examples of its own: the fuzzer runs in the default test tier. No deadline: the per-example time bound is the
watchdog's (fuzz_watchdog.bounded), which fails a hanging example instead of timing fast ones.

Examples are random each run (derandomize=False), from one seed per session: a failing test's report has a
"fuzz seed" section (rerun with `pytest tests/fuzz --hypothesis-seed=SEED`), and Hypothesis prints the falsifying
example and the @reproduce_failure blob that replays it (print_blob). Nothing is written into the tree: no example
database (database=None), and Hypothesis's own directory (where it would save failing-example patches) is a
temporary one. The explain phase is left out: it reruns a failing example many times, a hanging one 10 s each.
"""

import os
import random
import tempfile

import pytest
from hypothesis import HealthCheck, Phase, core, settings
from hypothesis.configuration import set_hypothesis_home_dir

from support import fuzz_watchdog

settings.register_profile(
    "specchat-fuzz",
    max_examples=100,
    deadline=None,
    derandomize=False,
    print_blob=True,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    # Hostile inputs are big on purpose, and some targets (a temp file, a database, Qt's layout) cost
    # milliseconds an example: neither is a problem with the test.
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.function_scoped_fixture,
    ],
)
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), f"specchat-fuzz-hypothesis-{os.getuid()}"))

SEED = None  # this session's, where --hypothesis-seed gave none


def pytest_configure(config):
    global SEED
    if config.getoption("hypothesis_seed", None) is None and core.global_force_seed is None:
        SEED = random.getrandbits(32)
        core.global_force_seed = SEED
    # The watchdog writes to the terminal's stderr, which pytest's capture keeps on another descriptor.
    capman = config.pluginmanager.getplugin("capturemanager")
    try:
        fuzz_watchdog.report_fd = os.dup(capman._global_capturing.err.targetfd_save)  # private: best effort
    except (AttributeError, OSError, TypeError):
        fuzz_watchdog.report_fd = 2


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and core.global_force_seed is not None:
        seed = core.global_force_seed
        report.sections.append(
            ("fuzz seed", f"seed {seed}: rerun with `pytest {item.nodeid} --hypothesis-seed={seed}`")
        )
