"""Step-cost curves of real model shapes on any llama.cpp backend, with nothing to download.

python -m engine.measure.gpu_kit write --out DIR [--shapes qwen2-0.5b,qwen2-1.5b,qwen2-7b,llama3-8b]
    [--quant Q4_0]
python -m engine.measure.gpu_kit curves --models DIR --out curves.json [--max-rows 64] [--gpu-layers N]
python -m engine.measure.gpu_kit sampling --out sampling.json

`write` makes GGUF files with random weights (Q4_0 unless --quant says) in the shapes of real models (their
vocabulary, width, depth, heads and feed-forward size): a step's cost depends on the shapes and the quantisation,
not on the weights, and such files are made in seconds where a real 7B could neither be downloaded nor carried.
`curves` loads each one (every layer on the GPU where the build has one) and times a target step per number of
verified rows, 1 to --max-rows, as decoding pays them (in_situ.py: each size after one-row steps, the mean of
rounds but the slowest), as a replay's recording does. The qwen2-0.5b curve's one-row step is what a draft token
of that size costs. `python -m engine.measure.replay replay REC --curves curves.json --shape qwen2-7b
--draft-shape qwen2-0.5b` then predicts what lookup, draft and auto would gain on that device on answers recorded
here. `sampling` times one sampled verification on the CPU and on CUDA (where torch has it), so the faster place
for that math is measured, not assumed.

Q4_0 rather than the usual Q4_K_M: it is the one 4-bit type every backend has and every row size here allows
(Q4_K needs widths in 256s; Qwen2 0.5B's is 896). The type matters on a CPU, where llama.cpp repacks some types
for faster multi-row kernels: a curve meant to stand for a real file is taken in that file's type (--quant Q4_1
for the embedded SmolLM2, whose Q4_0 curve made several verified rows 25-40% cheaper than its own).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

BLOCK = 32  # weights per block in each type below
# bytes per block, and how many leading f16 values (scale, then minimum) each block starts with
QUANTS = {"Q4_0": (18, 1), "Q4_1": (20, 2), "Q8_0": (34, 1)}
DEFAULT_QUANT = "Q4_0"


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # llama.cpp architecture: "qwen2" or "llama"
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    rope_theta: float
    tied_output: bool  # the output layer is the token embedding (no output.weight)

    @property
    def kv_width(self) -> int:
        """Width of the k and v projections: the kv heads times the head size (grouped-query attention)."""
        return self.n_head_kv * (self.n_embd // self.n_head)

    @property
    def parameters(self) -> int:
        attn = self.n_embd * (self.n_embd + 2 * self.kv_width) + self.n_embd * self.n_embd
        per_layer = attn + 3 * self.n_embd * self.n_ff
        return self.n_layer * per_layer + self.n_vocab * self.n_embd * (1 if self.tied_output else 2)


# From each model's config.json on Hugging Face.
SHAPES = {
    s.name: s
    for s in (
        Shape("qwen2-0.5b", "qwen2", 151936, 896, 24, 14, 2, 4864, 1_000_000.0, True),
        Shape("qwen2-1.5b", "qwen2", 151936, 1536, 28, 12, 2, 8960, 1_000_000.0, True),
        Shape("qwen2-7b", "qwen2", 152064, 3584, 28, 28, 4, 18944, 1_000_000.0, False),
        Shape("llama3-8b", "llama", 128256, 4096, 32, 32, 8, 14336, 500_000.0, False),
        # The embedded default's shape, so the kit's curve can be checked against live runs of the real model here.
        Shape("smollm2-135m", "llama", 49152, 576, 30, 9, 3, 1536, 100_000.0, True),
        # Not a real model: small enough for a test to write and time in a second or two.
        Shape("tiny-test", "llama", 4096, 256, 2, 4, 2, 512, 10_000.0, True),
    )
}
DEFAULT_SHAPES = ("qwen2-0.5b", "qwen2-1.5b", "qwen2-7b", "llama3-8b")
DEFAULT_MAX_ROWS = 64
CURVE_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 20, 24, 32, 40, 48, 56, 64)


class _WeightPool:
    """Random blocks of one type with small, finite f16 scales, of which every tensor is a view: a 7B file writes
    ~4 GB, and one pool as large as the largest tensor keeps memory to that one tensor."""

    def __init__(self, quant: str, largest_weights: int, seed: int = 0):
        self.block_bytes, halves = QUANTS[quant]
        blocks = -(-largest_weights // BLOCK)
        pool = np.random.default_rng(seed).integers(0, 256, size=(blocks, self.block_bytes), dtype=np.uint8)
        pool[:, : 2 * halves] = np.full(halves, 0.002, dtype=np.float16).view(np.uint8)  # scale (and minimum)
        self.bytes = pool.reshape(-1)

    def matrix(self, rows: int, cols: int) -> np.ndarray:
        width = cols // BLOCK * self.block_bytes
        return self.bytes[: rows * width].reshape(rows, width)


def _matrices(shape: Shape) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of every 2-D weight, as llama.cpp names them (numpy order: out × in)."""
    d, kv, ff = shape.n_embd, shape.kv_width, shape.n_ff
    out = [("token_embd.weight", shape.n_vocab, d)]
    for i in range(shape.n_layer):
        out += [
            (f"blk.{i}.attn_q.weight", d, d),
            (f"blk.{i}.attn_k.weight", kv, d),
            (f"blk.{i}.attn_v.weight", kv, d),
            (f"blk.{i}.attn_output.weight", d, d),
            (f"blk.{i}.ffn_gate.weight", ff, d),
            (f"blk.{i}.ffn_up.weight", ff, d),
            (f"blk.{i}.ffn_down.weight", d, ff),
        ]
    if not shape.tied_output:
        out.append(("output.weight", shape.n_vocab, shape.n_embd))
    return out


def _vectors(shape: Shape) -> list[tuple[str, np.ndarray]]:
    ones = np.ones(shape.n_embd, dtype=np.float32)
    out = [("output_norm.weight", ones)]
    q_bias, kv_bias = np.zeros(shape.n_embd, np.float32), np.zeros(shape.kv_width, np.float32)
    for i in range(shape.n_layer):
        out += [(f"blk.{i}.attn_norm.weight", ones), (f"blk.{i}.ffn_norm.weight", ones)]
        if shape.arch == "qwen2":  # Qwen2 has biases on q, k and v
            out += [
                (f"blk.{i}.attn_q.bias", q_bias),
                (f"blk.{i}.attn_k.bias", kv_bias),
                (f"blk.{i}.attn_v.bias", kv_bias),
            ]
    return out


def write(shape: Shape, path: Path, quant: str = DEFAULT_QUANT) -> Path:
    """A GGUF file of `shape` with random weights of type `quant`, and a made-up SentencePiece vocabulary of its
    size."""
    import gguf  # the writer from llama.cpp's gguf-py: a test dependency, and carried to a GPU machine

    matrices = _matrices(shape)
    pool = _WeightPool(quant, max(rows * cols for _, rows, cols in matrices))
    writer = gguf.GGUFWriter(str(path), shape.arch)
    writer.add_name(f"random {shape.name} (SpecChat GPU kit)")
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{quant}"))
    # SentencePiece: <unk> <s> </s>, the 256 byte tokens, then made-up pieces up to the vocabulary's size.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    tokens += [f"\u2581t{i}" for i in range(shape.n_vocab - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (shape.n_vocab - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * shape.n_vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, rows, cols in matrices:
        writer.add_tensor(name, pool.matrix(rows, cols), raw_dtype=getattr(gguf.GGMLQuantizationType, quant))
    for name, vector in _vectors(shape):
        writer.add_tensor(name, vector)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def curve(path: Path, max_rows: int = DEFAULT_MAX_ROWS, n_gpu_layers: int = -1, threads: int | None = None) -> dict:
    """Seconds of one target step by rows verified, timed on this machine's backend."""
    from ..decoding.runtime import LoadSettings, Model
    from .in_situ import time_in_situ

    rows = [r for r in CURVE_ROWS if r < max_rows] + [max_rows]
    model = Model(
        path, LoadSettings(n_ctx=1024, n_gpu_layers=n_gpu_layers, threads=threads, n_batch=max(512, max_rows))
    )
    try:
        context = [max(model.bos, 0)] + list(range(300, 556))  # the steps attend to 257 cells, as after a prompt
        model.prefill(context)
        seconds = time_in_situ(model, len(context), 300, rows)  # afresh, and not kept: the kit measures
        return {
            "backend": model.backend,
            "threads": model.threads,
            "context_cells": len(context),
            "seconds_by_rows": {str(r): seconds[r] for r in rows},
        }
    finally:
        model.close()


SAMPLING_VOCABS = (151936, 262144)  # Qwen2's and Gemma 3's
SAMPLING_ROWS = (1, 9, 33)


def sampling_costs(repeats: int = 20) -> dict:
    """Seconds of one sampled verification (T=0.8, top-k 40, top-p 0.95, min-p 0.05, lookup's point-mass drafts)
    by vocabulary and rows, on the CPU and, where torch has CUDA, on the GPU from the same host logits (llama.cpp
    hands them over in host memory, so the GPU's figure includes the copy). Fastest of `repeats`."""
    import torch

    from ..decoding.sampling import SamplingParams
    from ..decoding.verifier import Verifier

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rng = np.random.default_rng(0)
    out: dict = {"torch": torch.__version__, "devices": devices, "seconds": {}}
    for device in devices:
        verifier = Verifier(SamplingParams(), torch.device(device), seed=1)
        for vocab in SAMPLING_VOCABS:
            for rows in SAMPLING_ROWS:
                logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
                drafts = [int(t) for t in logits[:-1].argmax(axis=1)]  # kept whole: every row is read
                best = float("inf")
                for i in range(repeats + 1):  # the first warms the device's kernels
                    if device == "cuda":
                        torch.cuda.synchronize()
                    started = time.perf_counter()
                    verifier.verify(logits, drafts, None, position=i)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    if i:
                        best = min(best, time.perf_counter() - started)
                out["seconds"][f"{device} vocab={vocab} rows={rows}"] = best
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.measure.gpu_kit", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write random-weight GGUF files in real shapes")
    w.add_argument("--out", required=True)
    w.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help=f"any of {', '.join(SHAPES)}")
    w.add_argument("--quant", choices=sorted(QUANTS), default=DEFAULT_QUANT)
    c = sub.add_parser("curves", help="time each file's steps by rows verified")
    c.add_argument("--models", required=True, help="the folder `write` filled")
    c.add_argument("--out", required=True)
    c.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS)
    c.add_argument("--gpu-layers", type=int, default=-1)
    c.add_argument("--threads", type=int)
    m = sub.add_parser("sampling", help="time the sampling math on the CPU and on CUDA (where torch has it)")
    m.add_argument("--out", required=True)
    return ap.parse_args(argv)


def run_sampling(args: argparse.Namespace) -> int:
    costs = sampling_costs()
    Path(args.out).write_text(json.dumps(costs, indent=1), encoding="utf-8")
    for key, seconds in costs["seconds"].items():
        print(f"{key}: {seconds * 1e3:.2f} ms", file=sys.stderr)
    return 0


def run_write(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.shapes.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        print(f"error: unknown shape {', '.join(unknown)}; known: {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        started = time.perf_counter()
        path = write(SHAPES[name], out / f"{name}.gguf", args.quant)
        print(
            f"{path}: {path.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - started:.1f} s", file=sys.stderr
        )
    return 0


def run_curves(args: argparse.Namespace) -> int:
    import llama_cpp

    files = sorted(Path(args.models).glob("*.gguf"))
    if not files:
        print(f"error: no .gguf files in {args.models}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "machine": platform.machine(),
        "system": platform.system(),
        "llama_cpp": llama_cpp.__version__,
        "shapes": {},
    }
    for path in files:
        shape = SHAPES.get(path.stem)
        report["shapes"][path.stem] = {
            **({"shape": asdict(shape), "parameters": shape.parameters} if shape else {}),
            **curve(path, args.max_rows, args.gpu_layers, args.threads),
        }
        one = report["shapes"][path.stem]["seconds_by_rows"]
        print(
            f"{path.stem}: 1 row {one['1'] * 1e3:.1f} ms, {args.max_rows} rows {one[str(args.max_rows)] * 1e3:.1f} ms",
            file=sys.stderr,
        )
    Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return {"sampling": run_sampling, "write": run_write, "curves": run_curves}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
