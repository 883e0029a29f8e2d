"""`python -m engine.measure.fairness`: how long one long prompt holds up another client's stream, through the real
server over real HTTP (issue 51). Client 1 streams; once its pace is set, client 2 sends a long prompt, and client
1's longest gap between tokens while that prompt is prefilled is set against its usual gap (the median before).
Then client 3 sends another long prompt and hangs up mid-prefill: how long until /health shows its slot free.
Each --chunks entry is a Batch.prefill_chunk (0: whole prompts in one pump, as before chunked prefill), the entries
alternating round by round. Timings on a shared machine are noisy: compare ratios, and read the load printed."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import httpx

from ..decoding.proposers.base import NoProposer
from ..decoding.runtime import LoadSettings, Model
from ..decoding.speculation_config import SpeculationConfig
from ..modelfiles.embedded import embedded_gemma_path, embedded_model_path
from ..serving.service import ServeOptions, Service

WHOLE = 10**9  # a chunk no prompt reaches: the whole prompt in one pump


class Stream(threading.Thread):
    """One streaming /v1/completions client: when each chunk came and how many tokens it carried by then."""

    def __init__(self, url: str, prompt: str, max_tokens: int, hang_up_after: float | None = None):
        super().__init__(daemon=True)
        self.url, self.prompt, self.max_tokens, self.hang_up_after = url, prompt, max_tokens, hang_up_after
        self.arrivals: list[tuple[float, int]] = []  # (perf_counter, completion tokens so far)
        self.sent_at = self.closed_at = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        body = {
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        # Hanging up: nothing comes while the prompt is prefilled, so a read timeout is the moment to go.
        timeout = httpx.Timeout(600.0, read=self.hang_up_after) if self.hang_up_after else 600.0
        self.sent_at = time.perf_counter()
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=timeout) as reply:
                for line in reply.iter_lines():
                    if self.stop.is_set():
                        break
                    if line.startswith("data: {"):
                        usage = json.loads(line[6:]).get("usage") or {}
                        if usage.get("completion_tokens"):
                            self.arrivals.append((time.perf_counter(), usage["completion_tokens"]))
        except httpx.ReadTimeout:
            pass
        self.closed_at = time.perf_counter()

    def gaps(self, after: float = 0.0, until: float = float("inf")) -> list[float]:
        """Seconds between arrivals (per token), for the gaps that overlap (after, until)."""
        out = []
        for (t0, n0), (t1, n1) in zip(self.arrivals, self.arrivals[1:]):
            if t1 > after and t0 < until and n1 > n0:
                out += [(t1 - t0) / (n1 - n0)] * (n1 - n0)
        return out


def long_prompt(url: str, tokens: int, tag: str) -> tuple[str, int]:
    """A prompt of at least `tokens` tokens (counted by the server's /tokenize) that shares no start with another."""
    notes = 100
    while True:
        text = (
            tag
            + "."
            + "".join(
                f" Note {i}: the ferry to island {i % 17} leaves at {i % 12 + 1} o'clock, weather {i % 5}."
                for i in range(notes)
            )
        )
        count = httpx.post(url + "/tokenize", json={"prompt": text}).json()["count"]
        if count >= tokens:
            return text, count
        notes = int(notes * tokens / count) + 1


def wait_until(check, timeout: float, every: float = 0.005) -> float:
    deadline = time.perf_counter() + timeout
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError("gave up waiting")
        time.sleep(every)
    return time.perf_counter()


def one_round(service: Service, chunk: int, prompt_tokens: int, tag: str) -> dict:
    service.scheduler.batch.prefill_chunk = chunk or WHOLE  # read by the engine thread at its next pump
    url = service.url
    first = Stream(url, f"{tag}: The history of the old harbour town begins", 2000)
    first.start()
    wait_until(lambda: len(first.arrivals) >= 30, 120)
    text, count = long_prompt(url, prompt_tokens, tag + "b")
    second = Stream(url, text, 1)
    second.start()
    wait_until(lambda: second.arrivals, 600)
    ttft = second.arrivals[0][0] - second.sent_at
    wait_until(lambda: len(first.gaps(after=second.arrivals[0][0])) >= 10, 120)
    normal = statistics.median(first.gaps(until=second.sent_at))
    during = first.gaps(after=second.sent_at, until=second.arrivals[0][0])
    third = Stream(url, long_prompt(url, prompt_tokens, tag + "c")[0], 1, hang_up_after=1.0)
    third.start()
    health = lambda: httpx.get(url + "/health").json()["slots_processing"]  # noqa: E731
    wait_until(lambda: health() == 2, 30)
    third.join()
    freed = wait_until(lambda: health() == 1, 600, every=0.01) - third.closed_at
    first.stop.set()
    first.join()
    wait_until(lambda: health() == 0, 60)  # its hang-up seen, so the next round starts alone
    return {
        "chunk": chunk or "whole",
        "prompt_tokens": count,
        "normal_gap_ms": 1000 * normal,
        "max_gap_s": max(during),
        "ratio": max(during) / normal,
        "second_ttft_s": ttft,
        "freed_after_hang_up_s": freed,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="embedded (SmolLM2), gemma, or a .gguf path")
    parser.add_argument("--chunks", default="128,0", help="prefill chunks to compare; 0 = whole prompts")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    path = {"embedded": embedded_model_path, "gemma": embedded_gemma_path}.get(args.model, lambda: args.model)()
    model = Model(path, LoadSettings(n_ctx=4096, threads=args.threads, n_seq_max=2))
    service = Service(
        model, NoProposer(), SpeculationConfig(), ServeOptions(port=0, parallel=2), model_id="fairness"
    ).start()
    print(f"{model.name}, {args.threads} threads, load average before: {os.getloadavg()[0]:.2f}", flush=True)
    try:
        for r in range(args.rounds):
            for chunk in (int(c) for c in args.chunks.split(",")):
                row = one_round(service, chunk, args.prompt_tokens, f"Round {r} chunk {chunk}")
                print(
                    " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                    f"load={os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    finally:
        service.stop()
        model.close()


if __name__ == "__main__":
    main()
