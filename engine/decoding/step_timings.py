"""How long a target step of each size takes on this machine (calibration.time_steps measures them), kept so a model is
timed once, not at every load: in memory for this process, and in the cache folder for a day.

A table belongs to one model file (as model_check.file_identity tells files apart) loaded with the settings that change what a
step costs, on one llama.cpp build (its version and its GPU devices: a CPU and a Vulkan build of one version are two
builds) and CPU; it maps (threads, rows) to seconds. Not the context size: a step
attends to the cells in use, not to the whole cache (Gemma 3 270M here, 1/9/33 rows: 34/232/734 ms at n_ctx 256,
37/239/726 ms at 8192), so a new context size is not timed again. A day, because this machine's
speed is what they describe, and a busy or idle spell, a driver or a BIOS change make older readings wrong; the
planner's live step medians correct smaller drifts meanwhile (step_costs.StepCosts)."""

from __future__ import annotations

import json
import logging
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

import llama_cpp

from ..hardware import devices
from ..modelfiles.model_check import file_identity
from ..paths import cache_dir, write_text_atomic

FILE_NAME = "step-timings.json"
MAX_AGE_S = 24 * 3600
PLAUSIBLE_LOW, PLAUSIBLE_HIGH = 0.7, 1.5  # a step's bounds, in one-row steps (plausible)
log = logging.getLogger(__name__)

_tables: dict[str, dict[tuple[int, int], float]] = {}
_measured_at: dict[str, float] = {}
_lock = threading.Lock()


def table_for(
    path: Path, n_gpu_layers: int, n_batch: int, flash_attention: bool | None, repacked: int = -1
) -> dict[tuple[int, int], float]:
    """The shared, growing (threads, rows) -> seconds table of this file loaded with these settings (repacked:
    runtime.model_params' count of repacked weights): what this process measured, else what the cache folder
    holds from the last day, else a new empty one."""
    try:
        identity = file_identity(path)
    except OSError:
        return {}
    key = "|".join(
        map(
            str,
            (
                identity,
                n_gpu_layers,
                n_batch,
                flash_attention,
                repacked,
                llama_cpp.__version__,
                build_devices(),
                platform.machine(),
                platform.processor(),
                os.cpu_count(),
            ),
        )
    )
    with _lock:
        if key not in _tables:
            _measured_at[key], _tables[key] = _saved_table(_read().get(key))
        return _tables[key]


def build_devices() -> str:
    """The GPU devices this llama.cpp build runs on, "CPU" for none. Without them a Vulkan build of the same version
    (a rebuild with CMAKE_ARGS, or .venv-vulkan beside .venv: one cache folder) took the CPU build's step costs for a
    day and planned with them; and it timed nothing, which hid a crash of its own 3-row steps (vulkan_check.sh)."""
    return ",".join(f"{d.name}={d.description}" for d in devices() if d.is_gpu) or "CPU"


def save() -> None:
    """Write every table measured so far to the cache folder (a read-only one only means timing again)."""
    with _lock:
        kept = {k: v for k, v in _read().items() if _saved_table(v)[1]}  # a day-old or damaged entry goes
        for key, table in _tables.items():
            if table and plausible(table):
                kept[key] = {
                    "measured_at": _measured_at[key],
                    "seconds": {f"{t},{r}": s for (t, r), s in sorted(table.items())},
                }
        try:
            write_text_atomic(cache_dir() / FILE_NAME, json.dumps(kept, indent=1))
        except OSError as exc:
            log.info("step timings not saved: %s", exc)


def forget() -> None:
    """Time every model afresh from now on, as at a first start (tests of the timing itself)."""
    with _lock:
        _tables.clear()
        _measured_at.clear()
        (cache_dir() / FILE_NAME).unlink(missing_ok=True)


def plausible(table: dict[tuple[int, int], float]) -> bool:
    """Whether each step of r rows took between PLAUSIBLE_LOW of a one-row step and PLAUSIBLE_HIGH times r of them
    (at its thread count; a count whose one-row step is not timed yet is not judged): a batch costs at least about
    one row's pass over the weights and no more than its rows decoded one by one. A table outside that was timed
    in a busy spell (2 rows timed 12x one row here, during a
    test run) and is not kept for a day of planning."""
    ones = {threads: s for (threads, rows), s in table.items() if rows == 1}
    return all(
        threads not in ones or PLAUSIBLE_LOW * ones[threads] <= s <= PLAUSIBLE_HIGH * rows * ones[threads]
        for (threads, rows), s in table.items()
    )


def _key(text: str) -> tuple[int, int]:
    threads, rows = map(int, text.split(","))  # anything but two numbers: a ValueError, a damaged entry
    return threads, rows


def _saved_table(saved: Any) -> tuple[float, dict[tuple[int, int], float]]:
    """(when measured, table) of a saved entry from the last day; (now, {}) for none, an old, a damaged or an
    implausible one."""
    try:
        if time.time() - saved["measured_at"] < MAX_AGE_S:
            table = {_key(k): float(v) for k, v in saved["seconds"].items()}
            if plausible(table):
                return saved["measured_at"], table
    except (KeyError, TypeError, ValueError, AttributeError):
        pass
    return time.time(), {}


def _read() -> dict[str, Any]:
    try:
        saved = json.loads((cache_dir() / FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or damaged: time again
        return {}
    return saved if isinstance(saved, dict) else {}
