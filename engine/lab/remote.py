"""The lab's experiment against running servers (vLLM, llama-server, SpecChat elsewhere): each server is a
"method", measured at each number of concurrent clients through engine.serve_bench's path (streamed chat
requests, TTFT and inter-token gaps timed here, acceptance from the servers' timings or vLLM's /metrics), and
written as a lab results document, so the lab's report, plot, crossover and window read it as they read a run
on this machine. Name the plain deployment "none" to get speed-ups and the point where speculation stops paying.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import GenerationCancelled, InvalidSettingError
from ..remote.endpoint import normalised_url
from .bench import read_prompts
from .crossover import least_disturbed
from .schema import SCHEMA, LabProgress, cell_progress
from .serve_cell import RequestTrace, named_url, run_cell, served_model

MAX_CLIENTS = 1024


@dataclass
class RemoteLabConfig:
    prompts: str  # a JSON-lines file of {"id", "prompt"}
    servers: dict[str, str]  # name ("none" for plain decoding) → the server's URL
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = True
    repeats: int = 1
    api_keys: dict[str, str] = field(default_factory=dict, repr=False)  # URL → key; never written out

    def __post_init__(self) -> None:
        if not self.servers:
            raise InvalidSettingError("Name at least one server, e.g. none=http://127.0.0.1:8000.")
        self.servers = {name.strip(): normalised_url(url) for name, url in self.servers.items()}
        if any(not name for name in self.servers):
            raise InvalidSettingError("Every server needs a name (none=URL for the plain one).")
        self.concurrency = tuple(sorted(set(self.concurrency)))
        if not self.concurrency or any(not isinstance(c, int) or not 1 <= c <= MAX_CLIENTS for c in self.concurrency):
            raise InvalidSettingError(
                f"client counts must be whole numbers 1..{MAX_CLIENTS}, got {list(self.concurrency)}"
            )
        if not (isinstance(self.max_tokens, int) and 1 <= self.max_tokens <= 32768):
            raise InvalidSettingError(f"max tokens must be 1..32768, got {self.max_tokens!r}")
        if not (isinstance(self.repeats, int) and 1 <= self.repeats <= 20):
            raise InvalidSettingError(f"repeats must be 1..20, got {self.repeats!r}")


def parse_servers(specs: list[str]) -> dict[str, str]:
    """[NAME=]URL specs as a name → URL map; an unnamed one is named by its host."""
    out = {}
    for spec in specs:
        name, url = named_url(spec)
        url = normalised_url(url)
        out[name or url.split("://", 1)[1]] = url
    return out


def _bench_args(config: RemoteLabConfig, url: str, requests: int) -> argparse.Namespace:
    return argparse.Namespace(
        endpoint="chat",
        requests=requests,
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        seed=config.seed,
        ignore_eos=config.ignore_eos,
        api_key=config.api_keys.get(url),
    )


def lab_cell(cell: dict, method: str) -> dict:
    """A serve_bench cell in the lab's terms (what the server's machine cannot tell us from here is None)."""
    ms = lambda s: None if s is None else 1000.0 * s  # noqa: E731
    return {
        "method": method,
        "concurrency": cell["clients"],
        "requests": cell["requests"],
        "generated_tokens": cell["completion_tokens"],
        "wall_s": cell["wall_s"],
        "filler_requests": cell["filler_requests"],
        "filler_tokens": cell["filler_tokens"],
        "full_tokens_per_s": cell["full_tokens_per_s"],
        "aggregate_tokens_per_s": cell["aggregate_tokens_per_s"],
        "per_request_tokens_per_s": cell["client_tokens_per_s"],
        "itl_p50_ms": ms(cell["itl_p50_s"]),
        "itl_p95_ms": ms(cell["itl_p95_s"]),
        "e2e_p50_s": cell["e2e_p50_s"],
        "e2e_p95_s": cell["e2e_p95_s"],
        "ttft_p50_s": cell["ttft_p50_s"],
        "drafted": cell["drafted"],
        "accepted": cell["accepted"],
        "acceptance_rate": cell["acceptance_rate"],
        "mean_acceptance_length": cell["mean_acceptance_length"],
        "acceptance_source": cell["acceptance_source"],
        "per_position_acceptance": [],
        "errors": cell["errors"],
        "utilisation": {"kind": "remote", "percent": None},
        "memory": {"kind": "remote", "bytes": None},
    }


def run_remote_lab(
    config: RemoteLabConfig,
    on_progress: Callable[[LabProgress], None] | None = None,
    on_cell: Callable[[dict], None] | None = None,
    cancel: threading.Event | None = None,
) -> dict:
    """Every (server, clients) cell, servers alternating within a level; the results document (lab SCHEMA).
    Raises GenerationCancelled when cancel is set, EngineError subclasses on bad input."""
    cancel = cancel or threading.Event()
    prompts = [p["prompt"] for p in read_prompts(config.prompts)]
    if not prompts:
        raise InvalidSettingError(f"{config.prompts} holds no prompts")
    names = list(config.servers)
    for name in names:  # a warm-up request each: first requests allocate and compile on some servers
        url = config.servers[name]
        asyncio.run(run_cell(url, prompts[:1], 1, _bench_args(config, url, 1)))
    cells = _measure_levels(config, prompts, on_progress, on_cell, cancel)
    settings = {k: v for k, v in asdict(config).items() if k != "api_keys"}
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {
            **settings,
            "methods": names,
            "prompt_set": Path(config.prompts).stem,
            "prompt_count": len(prompts),
            "chat": True,
            "max_draft": None,
            "adaptive": None,
        },
        "env": {
            "remote": True,
            "backend": "remote",
            "servers": dict(config.servers),
            "model_name": ", ".join(
                sorted({served_model(u, _bench_args(config, u, 1)) for u in config.servers.values()})
            ),
        },
        "cells": cells,
    }


def _measure_levels(
    config: RemoteLabConfig,
    prompts: list[str],
    on_progress: Callable[[LabProgress], None] | None,
    on_cell: Callable[[dict], None] | None,
    cancel: threading.Event,
) -> list[dict]:
    """Every cell, level by level with the servers alternating in each; the fastest run of each kept."""
    names = list(config.servers)
    cells_total = len(config.concurrency) * len(names) * config.repeats
    index, number, cells = 0, 1000, []
    for clients in config.concurrency:
        requests = math.ceil(len(prompts) / clients)  # every prompt at least once, as the lab does
        expected = clients * requests * config.max_tokens
        measured: dict[str, list[dict]] = {n: [] for n in names}
        for repeat in range(config.repeats):
            for name in names if repeat % 2 == 0 else names[::-1]:  # alternate: outside load falls alike
                url, done, started = config.servers[name], [0], time.monotonic()

                def heard(
                    trace: RequestTrace,
                    index=index,
                    name=name,
                    done=done,
                    started=started,
                    clients=clients,
                    expected=expected,
                ) -> None:
                    done[0] += trace.completion_tokens
                    if on_progress:
                        elapsed = time.monotonic() - started
                        on_progress(cell_progress(index, cells_total, name, clients, done[0], expected, elapsed))

                cell = asyncio.run(
                    run_cell(
                        url,
                        prompts,
                        clients,
                        _bench_args(config, url, requests),
                        number,
                        on_request=heard,
                        cancel=cancel,
                        keep_full=True,
                    )
                )
                if cancel.is_set():
                    raise GenerationCancelled("the lab was cancelled")
                measured[name].append(lab_cell(cell, name))
                index += 1
            # the next numbers follow this repeat's, its fillers' included (on the server that sent the most)
            number += clients * requests + max(c["filler_requests"] for c in (m[-1] for m in measured.values()))
        for name in names:
            best = least_disturbed(measured[name])
            cells.append(best)
            if on_cell:
                on_cell(best)
    return cells
