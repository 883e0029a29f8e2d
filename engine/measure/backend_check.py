"""What SpecChat's GPU path does on this llama.cpp build's backend, read rather than assumed, as one JSON report.

python -m engine.measure.backend_check --out report.json [--model embedded] [--draft embedded] [--tokens 24]

packaging/vulkan_check.sh runs it on llama.cpp's Vulkan backend over Mesa's software device (lavapipe); it runs on
any build. The report holds: the backend and device; for GPU layers 0, half and all, the layers llama.cpp put on
the GPU (counted from its load log) and the memory figure the stats line shows for that load (under `vram` for
all layers); greedy answers of plain decoding, prompt lookup and the draft model on a few held-out prompts, whether
they agree (`greedy_equal`), and where one parts from plain decoding, the logit gap there (a near-tie when within
the kernels' batch-versus-row rounding); the lab's memory column for a small cell; and the system check's JSON. Speed means nothing on a software device.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import hardware
from ..chat_format import ChatFormatter
from ..decoding.generate import SpeculativeDecoder
from ..decoding.proposers.registry import proposer_for
from ..decoding.runtime import LoadSettings, Model
from ..decoding.sampling import SamplingParams
from ..decoding.speculation_config import SpeculationConfig
from ..lab import doctor
from ..lab.local import LabConfig, run_lab
from ..lab.report import memory_text
from ..modelfiles.embedded import resolve_model
from ..paths import resources_dir

GREEDY = SamplingParams(temperature=0.0)
CONTEXT = 1024
# A verify batch may round differently from a one-row decode (by up to ~1 logit on the CPU kernels: see
# tests/engine/test_generation.py), so greedy answers may part where the top two logits are this close.
NEAR_TIE = 1.25
PROMPT_IDS = ("fix-json", "sql-rename", "poem-copy")  # held-out prompts whose answers copy: lookup drafts there


def held_out_prompts() -> list[dict]:
    rows = [
        json.loads(line)
        for line in (resources_dir() / "prompts" / "heldout.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return [row for row in rows if row["id"] in PROMPT_IDS]


def offload(path: Path, gpu_layers: int, tokens: int) -> dict:
    """One load at this GPU-layers setting: where llama.cpp put the layers, and the memory figure of an answer."""
    with Model(path, LoadSettings(n_ctx=CONTEXT, n_gpu_layers=gpu_layers)) as model:
        decoder = SpeculativeDecoder(model)
        _, prompt, _ = ChatFormatter(model).render([{"role": "user", "content": "Name three rivers."}])
        for _ in decoder.generate(prompt, GREEDY, max_tokens=tokens, ignore_eos=True):
            pass
        where = model.placement
        return {
            "gpu_layers": gpu_layers,
            "backend": model.backend,
            "layers": where["layers"],
            "layers_on_gpu": where["layers_on_gpu"],
            "all_layers_offloaded": where["all_layers_offloaded"],
            "device_bytes": where["device_bytes"],
            "memory": decoder.stats.memory.to_dict() if decoder.stats.memory is not None else None,
            "device_memory": device_memory(),
        }


def device_memory() -> list[dict]:
    """What each GPU device says of its own memory now (ggml: the Vulkan memory budget where the driver has one)."""
    return [
        {**dev, "reports_use": None if dev["total_bytes"] is None else dev["free_bytes"] < dev["total_bytes"]}
        for dev in doctor.device_facts()
        if dev["gpu"]
    ]


def first_parting(model: Model, prompt: list[int], plain: list[int], other: list[int]) -> dict | None:
    """Where `other` first differs from plain decoding's greedy answer, and the gap there between the logit of
    plain's token and of `other`'s, teacher-forced through one-row decodes (plain decoding's own path)."""
    at = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b), None)
    if at is None:
        return None
    model.forget_all()
    logits = model.prefill(prompt, 0)
    assert logits is not None  # the prompt is not empty
    row = logits[0]
    for i, token in enumerate(plain[:at]):
        row = model.decode([token], len(prompt) + i, 1)[0]
    gap = float(row[plain[at]] - row[other[at]])
    return {
        "position": at,
        "plain_token": plain[at],
        "other_token": other[at],
        "logit_gap": round(gap, 4),
        "near_tie": abs(gap) <= NEAR_TIE,
    }


def greedy_answers(target_path: Path, draft_path: Path, tokens: int) -> dict:
    """Plain, lookup and draft greedy answers on the held-out prompts, with every layer on the GPU, compared."""
    settings = LoadSettings(n_ctx=CONTEXT, n_gpu_layers=-1)
    with (
        Model(target_path, settings) as target,
        Model(draft_path, settings) as draft,
        Model(target_path, settings) as checker,
    ):
        results = []
        for row in held_out_prompts():
            _, prompt, _ = ChatFormatter(target).render([{"role": "user", "content": row["prompt"]}])
            answers, stats = {}, {}
            for method in ("none", "lookup", "draft"):
                decoder = SpeculativeDecoder(
                    target,
                    proposer_for(method, target, draft, p_min=0.0),
                    SpeculationConfig(max_draft=8, adaptive=False),
                )  # verify every step
                decoder.forget()
                answers[method] = [
                    t for d in decoder.generate(prompt, GREEDY, max_tokens=tokens, ignore_eos=True) for t in d.tokens
                ]
                stats[method] = {"drafted": decoder.stats.drafted, "accepted": decoder.stats.accepted}
            partings = {
                m: first_parting(checker, list(prompt), answers["none"], answers[m]) for m in ("lookup", "draft")
            }
            results.append(
                {
                    "prompt": row["id"],
                    "tokens": len(answers["none"]),
                    "stats": stats,
                    "equal": {m: answers[m] == answers["none"] for m in ("lookup", "draft")},
                    "parts_at": {m: p for m, p in partings.items() if p is not None},
                    "text": target.detokenize(answers["none"]),
                }
            )
    equal = all(all(r["equal"].values()) for r in results)
    near_ties_only = all(p["near_tie"] for r in results for p in r["parts_at"].values())
    return {"greedy_equal": equal, "partings_are_near_ties": near_ties_only, "prompts": results}


def lab_memory(model: str) -> dict:
    """The lab's memory column for one small cell (2 requests side by side, every layer on the GPU)."""
    prompts = resources_dir() / "prompts" / "heldout.jsonl"
    cell = run_lab(LabConfig(str(prompts), model, methods=("none",), concurrency=(2,), max_tokens=8))["cells"][0]
    return {**cell["memory"], "shown": memory_text(cell)}


def check(model: str, draft: str, tokens: int) -> dict:
    target_path, draft_path = resolve_model(model), resolve_model(draft)
    probe = Model(target_path, LoadSettings(n_ctx=CONTEXT, n_gpu_layers=-1), vocab_only=True)
    blocks = int(probe.meta(f"{probe.meta('general.architecture')}.block_count") or 0)
    probe.close()
    loads = [offload(target_path, layers, tokens) for layers in (0, max(blocks // 2, 1), -1)]
    full = loads[-1]
    report = {
        "backend": hardware.backend_name(),
        "device": hardware.gpu_name() or None,
        "gpu_offload": hardware.gpu_offload_supported(),
        "model": target_path.name,
        "draft": draft_path.name,
        "layers_offloaded": full["layers_on_gpu"],
        "layers": full["layers"],
        "all_layers_offloaded": full["all_layers_offloaded"],
        "vram": full["memory"],
        "offload": loads,
    }
    report.update(greedy_answers(target_path, draft_path, tokens))
    report["lab_memory"] = lab_memory(model)
    # As Help → System check… opens: the facts and the model's load, no bench (speed means nothing here)
    report["system_check"] = doctor.check(model, None, None, LoadSettings(n_ctx=doctor.CONTEXT, n_gpu_layers=-1))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.measure.backend_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="where to write the JSON report")
    ap.add_argument("--model", default="embedded", help="a GGUF path, or 'embedded' (SmolLM2 135M, the default)")
    ap.add_argument("--draft", default="embedded", help="a draft of the same vocabulary (default: the model itself)")
    ap.add_argument("--tokens", type=int, default=24, help="tokens per answer (24)")
    args = ap.parse_args(argv)
    report = check(args.model, args.draft, args.tokens)
    args.out.write_text(json.dumps(report, indent=1))
    print(
        json.dumps(
            {
                k: report[k]
                for k in (
                    "backend",
                    "device",
                    "layers_offloaded",
                    "all_layers_offloaded",
                    "greedy_equal",
                    "partings_are_near_ties",
                )
            }
            | {"vram": report["vram"]["label"]}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
