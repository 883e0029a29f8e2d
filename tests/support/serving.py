"""The real OpenAI-compatible server for the server tests: on the embedded SmolLM2 (start) or on a tiny GGUF
(serve); a probe that asks /health while work the test holds in progress waits (Hold, healthy_while_held), and one
that times /health while other work runs, for the hostile figures (while_healthy)."""

from __future__ import annotations

import asyncio
import inspect
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


# How long a test waits for what must happen: a guard that keeps a broken server from hanging the test, never a bound
# on how fast anything is (the machine is shared and its load unknown).
GUARD_S = 60.0


class Hold:
    """Calls of owner.name stop at their start until release() (or GUARD_S): the server is then provably in the
    middle of that work for as long as the test likes. An async function waits without holding the event loop;
    a blocking one holds its thread, as the real work would. left: a call went on past the hold (released, or
    the guard ran out); finished: a call returned or raised."""

    def __init__(self, monkeypatch, owner, name: str):
        self.entered, self.left, self.finished = threading.Event(), threading.Event(), threading.Event()
        self._released = threading.Event()
        self.calls = 0
        real = getattr(owner, name)

        def enter() -> None:
            self.calls += 1
            self.entered.set()

        if inspect.iscoroutinefunction(real):

            async def held(*args, **kwargs):
                enter()
                try:
                    await asyncio.to_thread(self._released.wait, GUARD_S)
                    self.left.set()
                    return await real(*args, **kwargs)
                finally:
                    self.finished.set()

        else:

            def held(*args, **kwargs):
                enter()
                try:
                    self._released.wait(GUARD_S)
                    self.left.set()
                    return real(*args, **kwargs)
                finally:
                    self.finished.set()

        monkeypatch.setattr(owner, name, held)

    def release(self) -> None:
        self._released.set()


def healthy_while_held(url: str, work, hold: Hold) -> tuple[object, int]:
    """Run work() on a thread; once it reaches hold, /health must answer 200 "ok" before the held call goes on, so
    the server answered while that work was still in progress (an ordering: no time is measured). /health is then
    asked until work() ends. Returns work's result and the largest growth of this process tree's memory."""
    result, base = {}, tree_rss()
    thread = threading.Thread(target=lambda: result.setdefault("r", work()), daemon=True)
    thread.start()
    try:
        with httpx.Client(timeout=GUARD_S) as client:
            try:
                while not hold.entered.wait(0.05):
                    assert thread.is_alive(), "the work ended without reaching its hold"
                health = client.get(url + "/health")  # a server that makes /health wait for the work times out here
                assert not hold.left.is_set(), "/health answered only once the held work went on"
            finally:
                hold.release()
            assert health.status_code == 200 and health.json()["status"] == "ok", health.text
            grew = tree_rss() - base
            while thread.is_alive():
                assert client.get(url + "/health").json()["status"] == "ok"
                grew = max(grew, tree_rss() - base)
                time.sleep(0.05)
    finally:  # on a failure too: the server is not stopped under the held work, nor the work's request cut
        if hold.entered.is_set():
            hold.finished.wait(GUARD_S)
        thread.join(GUARD_S)
    return result["r"], grew


def while_healthy(url: str, work) -> tuple[object, float, int]:
    """Run work() on a thread while /health is asked again and again: work's result, the slowest /health
    answer and the largest growth of this process tree's memory meanwhile. For the figures
    (hostile_figures.py); the tests prove /health answers with healthy_while_held, not by how fast."""
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
