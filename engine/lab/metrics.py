"""The figures of one lab cell (one method at one concurrency), from what the batch decoder recorded.

Everything is counted or timed; a figure that cannot be read is None (shown as "n/a").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import psutil

from ..decoding.batch_decode import BatchResult
from ..figures import mean_accepted_length
from ..hardware import read_memory

log = logging.getLogger(__name__)

GPU_SAMPLE_S = 0.2


def percentile(values, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def summarise_cell(result: BatchResult, method: str, concurrency: int) -> dict:
    """Throughput, latency and acceptance figures for one cell."""
    acceptance = _acceptance(result.runs)
    return {
        "method": method,
        "concurrency": concurrency,
        "requests": len(result.runs),
        **_throughput(result),
        **_latency(result.runs),
        **acceptance,
        **_steps(result, method, acceptance["drafted"]),
    }


def _throughput(result: BatchResult) -> dict:
    totals, generated = result.totals, result.generated
    per_request = [r.decode_tokens_per_s for r in result.runs if r.decode_tokens_per_s is not None]
    return {
        "generated_tokens": generated,
        "wall_s": result.wall_s,
        # Fillers kept every slot busy until the last request was answered (BatchDecoder.run's keep_full): their
        # tokens are the level's work too, as a busy server's other clients' would be.
        "aggregate_tokens_per_s": (generated + result.filler_tokens) / result.wall_s if result.wall_s > 0 else None,
        # What a level is judged by: decode throughput while every slot was busy, prefills left out. The aggregate
        # also holds the prefills, and a filler admitted just before the level ends pays its whole prefill for a
        # few tokens, and a method that ends answers sooner admits more (SmolLM2, grounded prompts, 48 tokens, in
        # the lab window: at 4 sequences lookup made 0.78-0.88x plain decoding's aggregate, 1.14x at full load).
        "full_tokens_per_s": totals.full_tokens / totals.full_s if totals.full_s > 0 else None,
        "full_tokens": totals.full_tokens,
        "filler_requests": len(result.fillers),
        "filler_tokens": result.filler_tokens,
        "per_request_tokens_per_s": float(np.mean(per_request)) if per_request else None,
    }


def _latency(runs) -> dict:
    gaps = [g for r in runs for g in r.inter_token_gaps()]
    e2e = [r.end_to_end_s for r in runs if r.end_to_end_s is not None]
    ttft = [r.stats.ttft_s for r in runs if r.stats.ttft_s is not None]
    return {
        "itl_p50_ms": _ms(percentile(gaps, 50)),
        "itl_p95_ms": _ms(percentile(gaps, 95)),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p95_s": percentile(e2e, 95),
        "ttft_p50_s": percentile(ttft, 50),
    }


def _acceptance(runs) -> dict:
    drafted = sum(r.stats.drafted for r in runs)
    accepted = sum(r.stats.accepted for r in runs)
    verify_steps = sum(r.stats.verify_steps for r in runs)
    speculative_steps = sum(r.stats.speculative_steps for r in runs)
    slots = max((len(r.stats.per_position_drafted) for r in runs), default=0)
    slot_drafted = [
        sum(r.stats.per_position_drafted[i] for r in runs if i < len(r.stats.per_position_drafted))
        for i in range(slots)
    ]
    slot_accepted = [
        sum(r.stats.per_position_accepted[i] for r in runs if i < len(r.stats.per_position_accepted))
        for i in range(slots)
    ]
    return {
        "drafted": drafted,
        "accepted": accepted,
        "verify_steps": verify_steps,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_acceptance_length": mean_accepted_length(accepted, speculative_steps),
        "per_position_acceptance": [a / d for d, a in zip(slot_drafted, slot_accepted) if d],
    }


def _steps(result: BatchResult, method: str, drafted: int) -> dict:
    totals = result.totals
    return {
        "batch_steps": totals.steps,
        # The concurrency itself where fillers keep the slots busy (below it only where no request was left to take
        # a freed slot: a level run without them)
        "mean_in_flight": totals.sequence_s / totals.verify_s if totals.verify_s else None,
        "rows_per_step": totals.rows / totals.steps if totals.steps else None,
        "step_time_by_rows": {
            str(rows): {"steps": n, "mean_ms": 1000.0 * s / n}
            for rows, (n, s) in sorted(totals.step_time_by_rows.items())
        },
        "draft_ms_per_token": 1000.0 * totals.draft_s / drafted if drafted and totals.draft_s else None,
        # What proposing cost: its share of the level's wall time, and the draft model's weights where one runs.
        "draft_share": totals.draft_s / result.wall_s if method != "none" and result.wall_s > 0 else None,
        "draft_model_bytes": next((r.stats.draft_model_bytes for r in result.runs if r.stats.draft_model_bytes), None),
        "prefill_s": totals.prefill_s,
    }


@dataclass
class Utilisation:
    kind: str  # "GPU" or "CPU"
    percent: float | None
    source: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "percent": self.percent, "source": self.source}


class _NvmlSampler:
    """Samples NVML's GPU utilisation in a background thread (NVIDIA only, needs nvidia-ml-py)."""

    def __init__(self):
        import pynvml  # noqa: F401 — raises ImportError where absent

        self._pynvml = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not self._handles:
            raise RuntimeError("NVML lists no GPU")
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(GPU_SAMPLE_S):
            try:
                busiest = max(self._pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles)
                self._samples.append(float(busiest))
            except Exception as exc:  # a driver hiccup loses one sample, not the run
                log.debug("NVML sample failed: %s", exc)

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return float(np.mean(self._samples)) if self._samples else None


class UtilisationMeter:
    """GPU utilisation (NVML) when a GPU runs the model and can be read; otherwise this process's CPU
    use as a share of all logical cores, from its CPU time over the wall time."""

    def __init__(self, backend: str):
        self.backend = backend
        self.result: Utilisation | None = None

    def __enter__(self) -> UtilisationMeter:
        self._gpu = None
        if self.backend != "CPU":
            try:
                self._gpu = _NvmlSampler()
            except Exception as exc:  # no NVIDIA GPU, no driver, or no nvidia-ml-py
                log.debug("GPU utilisation not readable: %s", exc)
        self._process = psutil.Process()
        times = self._process.cpu_times()
        self._cpu0, self._t0 = times.user + times.system, time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self._gpu is not None:
            self.result = Utilisation("GPU", self._gpu.stop(), "NVML utilisation, busiest GPU, mean of samples")
            return
        times = self._process.cpu_times()
        wall = time.perf_counter() - self._t0
        cores = os.cpu_count() or 1
        percent = 100.0 * (times.user + times.system - self._cpu0) / wall / cores if wall > 0 else None
        self.result = Utilisation("CPU", percent, f"process CPU time / wall time, share of {cores} cores")


def memory_figure(backend: str) -> dict:
    return read_memory(backend).to_dict()
