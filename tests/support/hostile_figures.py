"""The figures behind the limits for hostile input (README, "Untrusted files"), measured rather than asserted:

    .venv/bin/python -m tests.support.hostile_figures

1. a normal chat-template render through engine/template_sandbox.py against in-process, and the child's start;
2. each hostile template of hostile_templates.py: time to refusal, and the growth of this process tree's
   resident memory meanwhile;
3. the server under hostile requests (the embedded SmolLM2 for sizes, a tiny GGUF whose template spins or hogs
   memory): status, time, the slowest /health answer meanwhile, memory growth.
Run it on a quiet machine: two cores shared with anything else make every time here several times longer."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("SPECCHAT_CACHE_DIR", tempfile.mkdtemp())

import httpx
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.speculation_config import SpeculationConfig
from engine.modelfiles.embedded import embedded_model_path
from engine.serving.service import ServeOptions, Service
from engine.template_sandbox import TemplateRefused, TemplateSandbox

from .hostile_templates import CHATML, HELLO, HOGS, HOSTILE, hostile_gguf, tree_rss
from .serving import SPINS_ON_W9, while_healthy


def renders() -> None:
    sandbox = TemplateSandbox()
    started = time.perf_counter()
    sandbox.render(CHATML, HELLO)
    print(f"sandbox start and first render: {time.perf_counter() - started:.3f} s")
    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hello there " * 20} for i in range(9)]
    chat.append({"role": "user", "content": "x"})
    direct = Jinja2ChatFormatter(template=CHATML, eos_token="", bos_token="")
    for label, render in (
        ("sandbox", lambda: sandbox.render(CHATML, chat)),
        ("in-process", lambda: direct(messages=chat)),
    ):
        started = time.perf_counter()
        for _ in range(500):
            render()
        print(f"{label}: a normal render (10 messages, ChatML) {(time.perf_counter() - started) / 500 * 1000:.3f} ms")
    for name, template in HOSTILE.items():
        base, peak, out = tree_rss(), 0, {}

        def run(template=template, out=out):
            started = time.perf_counter()
            try:
                sandbox.render(template, HELLO)
                out["said"] = "rendered"
            except TemplateRefused as exc:
                out["said"] = exc.reason
            out["took"] = time.perf_counter() - started

        thread = threading.Thread(target=run)
        thread.start()
        while thread.is_alive():
            peak = max(peak, tree_rss() - base)
            time.sleep(0.01)
        print(f"{name:17s} refused in {out['took']:.2f} s, memory +{peak >> 20} MB: {out['said'][:80]}")
    sandbox.close()


def report(label: str, url: str, work) -> None:
    started = time.monotonic()
    reply, slowest, grew = while_healthy(url, work)
    code = reply.json().get("error", {}).get("code")
    print(
        f"{label}: {reply.status_code} {code} in {time.monotonic() - started:.2f} s; slowest /health "
        f"{slowest * 1000:.0f} ms; memory +{grew >> 20} MB"
    )


def server() -> None:
    model = Model(embedded_model_path(), LoadSettings(n_ctx=4096, threads=2, n_seq_max=4))
    service = Service(
        model, LookupProposer(), SpeculationConfig(), ServeOptions(port=0, parallel=4), model_id="smollm2"
    ).start()
    url = service.url
    body = json.dumps({"messages": [{"role": "user", "content": "The quick brown fox. " * 1_000_000}]}).encode()
    report(
        f"SmolLM2, a {len(body) >> 20} MiB body",
        url,
        lambda: httpx.post(
            url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=120
        ),
    )
    giant = "The quick brown fox jumps over the lazy dog. " * 140_000
    report(
        f"SmolLM2, a {len(giant) / 2**20:.1f} MiB message",
        url,
        lambda: httpx.post(
            url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": giant}]}, timeout=120
        ),
    )
    report(
        f"SmolLM2, a {len(giant) / 2**20:.1f} MiB raw prompt",
        url,
        lambda: httpx.post(url + "/v1/completions", json={"prompt": giant}, timeout=120),
    )
    service.stop()
    model.close()
    folder = Path(tempfile.mkdtemp())
    for name, template in (("spins on w9", SPINS_ON_W9), ("hogs memory", HOGS)):
        model = Model(
            hostile_gguf(folder / f"{name.replace(' ', '-')}.gguf", template, complete=True),
            LoadSettings(n_ctx=512, threads=1, n_seq_max=2),
        )
        service = Service(
            model, LookupProposer(), SpeculationConfig(max_draft=4), ServeOptions(port=0, parallel=2), model_id="tiny"
        ).start()
        report(
            f"tiny GGUF, a template that {name}",
            service.url,
            lambda url=service.url: httpx.post(
                url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "w9"}], "max_tokens": 4},
                timeout=120,
            ),
        )
        service.stop()
        model.close()


if __name__ == "__main__":
    renders()
    server()
