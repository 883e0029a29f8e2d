"""The real OpenAI-compatible server for the server tests: on the embedded SmolLM2 (start) or on a tiny GGUF
(serve), and a probe that asks /health while other work runs (while_healthy)."""

from __future__ import annotations

import threading
import time

import httpx

from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.speculation_config import SpeculationConfig
from engine.modelfiles.embedded import embedded_model_path
from engine.serving.service import ServeOptions, Service

from .hostile_templates import CHATML, SPINS, tree_rss

N_CTX = 1024
PARALLEL = 4
COUNTING = [{"role": "user", "content": "Write the numbers from 1 to 30, separated by commas."}]


def start(parallel=PARALLEL, proposer=None, **options) -> tuple[Service, Model]:
    model = Model(embedded_model_path(), LoadSettings(n_ctx=N_CTX, threads=2, n_seq_max=parallel))
    service = Service(
        model,
        proposer or LookupProposer(),
        SpeculationConfig(max_draft=8),
        ServeOptions(port=0, parallel=parallel, **options),
        model_id="smollm2",
    ).start()
    return service, model


# Fine on the probe's conversation; spins when a message holds the word w9.
SPINS_ON_W9 = CHATML.replace("{% endfor %}", "{% if 'w9' in m['content'] %}" + SPINS + "{% endif %}{% endfor %}")


def serve(path, **options) -> tuple[Service, Model]:
    model = Model(path, LoadSettings(n_ctx=512, threads=1, n_seq_max=2))
    service = Service(
        model,
        LookupProposer(),
        SpeculationConfig(max_draft=4),
        ServeOptions(port=0, parallel=2, **options),
        model_id="tiny",
    ).start()
    return service, model


def while_healthy(url: str, work) -> tuple[object, float, int]:
    """Run work() on a thread while /health is asked again and again: work's result, the slowest /health
    answer and the largest growth of this process tree's memory meanwhile."""
    result, base = {}, tree_rss()
    thread = threading.Thread(target=lambda: result.setdefault("r", work()))
    thread.start()
    slowest, grew = 0.0, 0
    with httpx.Client(timeout=10) as client:
        while thread.is_alive():
            started = time.monotonic()
            assert client.get(url + "/health").json()["status"] == "ok"
            slowest = max(slowest, time.monotonic() - started)
            grew = max(grew, tree_rss() - base)
            time.sleep(0.05)
    thread.join()
    return result["r"], slowest, grew
