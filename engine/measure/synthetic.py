"""Tiny GGUF models with a built-in drafter whose quality is known, written with the `gguf` package (nothing is
downloaded), so MTP drafting can be built and tested on any machine.

python -m engine.measure.synthetic OUTDIR [--json]
    writes mtp-agreeing.gguf, mtp-random.gguf, mtp-half.gguf and mtp-half-context.gguf into OUTDIR, and the EAGLE-3
    heads eagle3-agreeing.gguf and eagle3-random.gguf for them (synthetic_eagle3.py); with --json the last stdout
    line is one JSON object {name: path}.

Each file is a qwen35 (the llama.cpp architecture of Qwen3.5: gated delta net and full attention layers) of width
64 with two trunk layers (layer 0 recurrent, layer 1 attention) and one MTP ("nextn") layer, ~0.7 MB in F32. Every
output projection of the trunk (attention, SSM and FFN) is zero, so the residual stream is the token embedding
E[t] and the final hidden state is rmsnorm(E[t]). The output matrix's row NEXT[t] is (a sum holding) E[t], so
greedy decoding follows a fixed successor table: after token t comes NEXT[t], whatever came before. The printable
pieces form one cycle, so a greedy answer is printable text and never ends before its length limit.

The MTP block sees [enorm(E[x]) | hnorm(h)] for the token x just decided; with eh_proj = [I | 0] and zero output
projections it passes rmsnorm(E[x]) to the head, which then predicts NEXT[x]: exactly the token the target will
choose next (mtp-agreeing). mtp-random has a random eh_proj (right about 1 time in the vocabulary's size);
mtp-half has its own head (nextn.shared_head_head) that predicts NEXT[x] for a fixed random half of the pieces and
the token after that for the others.

The trunk of those three ignores context (its attention and recurrent outputs are zero): a wrong rollback of the
KV cache or the recurrent state after a rejected draft cannot change what they say, so they do not test rollback.
mtp-half-context does: it is mtp-half whose recurrent layer (gated delta net, layer 0) writes into the residual
stream, strongly enough that its state (a decaying mix of the last few tokens) decides most greedy next tokens.
Its answer is no fixed table's, only llama.cpp's (plain decoding is the reference), and a recurrent state left
holding rejected drafts changes it.

The vocabulary (synthetic_vocab.py) is SentencePiece-style: any UTF-8 text tokenizes by byte fallback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .synthetic_eagle3 import EAGLE3_HEADS
from .synthetic_eagle3 import write as write_head
from .synthetic_vocab import CONTEXT, N_EMBD, N_FF, Vocab, _add_vocab, _f32, build_vocab

ARCH = "qwen35"
N_HEAD = 2
HEAD_DIM = 32
N_TRUNK = 2  # layer 0 gated delta net, layer 1 full attention (full_attention_interval 2)
N_NEXTN = 1  # llama.cpp's qwen35 MTP graph asserts exactly one nextn layer
SSM_CONV, SSM_STATE, SSM_GROUPS, SSM_HEADS = 4, 16, 2, 2
SSM_INNER = SSM_STATE * SSM_HEADS  # value_dim: head_v_dim is the state size in llama.cpp's qwen35
SEED = 20251207
HEADS = ("mtp-agreeing", "mtp-random", "mtp-half")  # context-free trunks: greedy follows Design.next_token
CONTEXT_HEADS = ("mtp-half-context",)  # the recurrent state decides the next token: rollback shows
MTP_FILES = HEADS + CONTEXT_HEADS
# mtp-half-context's recurrence (std of its weights): inputs big enough that the state is not lost in the norm's
# epsilon, and an output projection that often outweighs the token embedding (measured: 43 of the 64 greedy tokens
# after the tests' prompt are not the context-free successor)
RECURRENCE_QKV, RECURRENCE_CONV, RECURRENCE_GATE, RECURRENCE_OUT = 0.3, 0.5, 0.3, 0.5


def successor_table(vocab: Vocab, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(NEXT, LIKE): the printable pieces in one random cycle (NEXT); every other token t is made to look like
    a random piece LIKE[t] (its embedding a noisy copy of that piece's) and so shares that piece's successor."""
    order = [int(i) for i in rng.permutation(vocab.pieces)]
    like = np.arange(len(vocab.tokens), dtype=np.int64)
    nxt = np.zeros(len(vocab.tokens), dtype=np.int64)
    for i, tok in enumerate(order):
        nxt[tok] = order[(i + 1) % len(order)]
    pieces = set(order)
    for t in range(len(vocab.tokens)):
        if t not in pieces:
            like[t] = order[int(rng.integers(len(order)))]
            nxt[t] = nxt[like[t]]
    return nxt, like


def embeddings(vocab: Vocab, like: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random piece embeddings; every other token's is a noisy copy of the piece it looks like."""
    embed = rng.normal(0.0, 1.0, size=(len(vocab.tokens), N_EMBD))
    others = like != np.arange(len(like))
    embed[others] = embed[like[others]] + rng.normal(0.0, 0.25, size=(int(others.sum()), N_EMBD))
    return embed


def head_matrix(embed: np.ndarray, table: np.ndarray, pieces: list[int]) -> np.ndarray:
    """An output matrix under which a piece p's normalised embedding scores highest on table[p]: row u sums
    the E[p] with table[p] = u (the other tokens follow the piece they look like)."""
    out = np.zeros_like(embed)
    np.add.at(out, table[pieces], embed[pieces])
    return out


def argmax_next(embed: np.ndarray, head: np.ndarray) -> np.ndarray:
    """The token each token's (normalised) embedding scores highest on under head: what llama.cpp will pick."""
    normed = embed / np.sqrt(np.mean(embed * embed, axis=1, keepdims=True) + 1e-6)
    return np.asarray(np.argmax(normed @ head.T, axis=1))


def half_table(vocab: Vocab, nxt: np.ndarray, like: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """mtp-half's predictions: right (NEXT[p]) for a random half of the pieces, the token after next elsewhere."""
    chosen = {int(t) for t in rng.choice(vocab.pieces, size=len(vocab.pieces) // 2, replace=False)}
    wrong = nxt[nxt]
    half = np.array([nxt[t] if t in chosen else wrong[t] for t in range(len(nxt))], dtype=np.int64)
    return np.asarray(half[like])


def trunk_tensors(embed: np.ndarray, output: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The two trunk layers with every output projection zero (shapes as numpy sees them: ggml's reversed)."""

    def small(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, size=shape)

    ones, zeros = np.ones, np.zeros
    key_dim = SSM_STATE * SSM_GROUPS
    t: dict[str, np.ndarray] = {"token_embd.weight": embed, "output_norm.weight": ones(N_EMBD), "output.weight": output}
    for il in range(N_TRUNK):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = ones(N_EMBD)
        t[p + "post_attention_norm.weight"] = ones(N_EMBD)
        t[p + "ffn_gate.weight"] = small(N_FF, N_EMBD)
        t[p + "ffn_up.weight"] = small(N_FF, N_EMBD)
        t[p + "ffn_down.weight"] = zeros((N_EMBD, N_FF))
        if (il + 1) % 2 == 0:  # full attention
            t.update(_attention(p, small))
            continue
        t[p + "attn_qkv.weight"] = small(key_dim * 2 + SSM_INNER, N_EMBD)
        t[p + "attn_gate.weight"] = small(SSM_INNER, N_EMBD)
        t[p + "ssm_conv1d.weight"] = small(key_dim * 2 + SSM_INNER, SSM_CONV)
        t[p + "ssm_dt.bias"] = zeros(SSM_HEADS)
        t[p + "ssm_a"] = -ones(SSM_HEADS)
        t[p + "ssm_beta.weight"] = small(SSM_HEADS, N_EMBD)
        t[p + "ssm_alpha.weight"] = small(SSM_HEADS, N_EMBD)
        t[p + "ssm_norm.weight"] = ones(SSM_STATE)
        t[p + "ssm_out.weight"] = zeros((N_EMBD, SSM_INNER))
    return t


def _attention(prefix: str, small: Callable[..., np.ndarray]) -> dict[str, np.ndarray]:
    """A gated full-attention block (Q carries its gate: twice the heads' width) whose output projection is 0."""
    return {
        prefix + "attn_q.weight": small(HEAD_DIM * N_HEAD * 2, N_EMBD),
        prefix + "attn_k.weight": small(HEAD_DIM * N_HEAD, N_EMBD),
        prefix + "attn_v.weight": small(HEAD_DIM * N_HEAD, N_EMBD),
        prefix + "attn_output.weight": np.zeros((N_EMBD, HEAD_DIM * N_HEAD)),
        prefix + "attn_q_norm.weight": np.ones(HEAD_DIM),
        prefix + "attn_k_norm.weight": np.ones(HEAD_DIM),
    }


def recurrence_tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Layer 0's gated delta net made to matter: the tensors of trunk_tensors that mtp-half-context replaces."""
    key_dim = SSM_STATE * SSM_GROUPS
    return {
        "blk.0.attn_qkv.weight": rng.normal(0.0, RECURRENCE_QKV, size=(key_dim * 2 + SSM_INNER, N_EMBD)),
        "blk.0.ssm_conv1d.weight": rng.normal(0.0, RECURRENCE_CONV, size=(key_dim * 2 + SSM_INNER, SSM_CONV)),
        "blk.0.attn_gate.weight": rng.normal(0.0, RECURRENCE_GATE, size=(SSM_INNER, N_EMBD)),
        "blk.0.ssm_out.weight": rng.normal(0.0, RECURRENCE_OUT, size=(N_EMBD, SSM_INNER)),
    }


def mtp_tensors(eh_proj: np.ndarray, shared_head: np.ndarray | None, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The nextn block (layer N_TRUNK): eh_proj maps [enorm(e) | hnorm(h)] (128) to the width (64)."""

    def small(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, size=shape)

    p = f"blk.{N_TRUNK}."
    t = {
        p + "attn_norm.weight": np.ones(N_EMBD),
        p + "post_attention_norm.weight": np.ones(N_EMBD),
        p + "ffn_gate.weight": small(N_FF, N_EMBD),
        p + "ffn_up.weight": small(N_FF, N_EMBD),
        p + "ffn_down.weight": np.zeros((N_EMBD, N_FF)),
        p + "nextn.eh_proj.weight": eh_proj,
        p + "nextn.enorm.weight": np.ones(N_EMBD),
        p + "nextn.hnorm.weight": np.ones(N_EMBD),
    }
    t.update(_attention(p, small))
    if shared_head is not None:
        t[p + "nextn.shared_head_head.weight"] = shared_head
    return t


def write_gguf(path: Path, vocab: Vocab, tensors: dict[str, np.ndarray], name: str) -> None:
    import gguf  # the test extra's package: only this research tool needs it

    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_TRUNK + N_NEXTN)
    writer.add_uint32(f"{ARCH}.nextn_predict_layers", N_NEXTN)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_array(f"{ARCH}.rope.dimension_sections", [8, 4, 4, 0])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_uint32(f"{ARCH}.full_attention_interval", 2)
    writer.add_uint32(f"{ARCH}.ssm.conv_kernel", SSM_CONV)
    writer.add_uint32(f"{ARCH}.ssm.inner_size", SSM_INNER)
    writer.add_uint32(f"{ARCH}.ssm.state_size", SSM_STATE)
    writer.add_uint32(f"{ARCH}.ssm.time_step_rank", SSM_HEADS)
    writer.add_uint32(f"{ARCH}.ssm.group_count", SSM_GROUPS)
    _add_vocab(writer, vocab)
    for tensor_name, array in tensors.items():
        writer.add_tensor(tensor_name, _f32(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@dataclass(frozen=True)
class Design:
    """What the files are built to do, so tests can check llama.cpp against it: NEXT[t] is the target's greedy
    successor of t in the context-free files (HEADS), and each head's table what its MTP draft after token t is
    built to be (mtp-half-context's head is mtp-half's)."""

    vocab: Vocab
    next_token: np.ndarray
    head_tables: dict[str, np.ndarray]


def build(seed: int = SEED) -> tuple[Design, dict[str, dict[str, np.ndarray]]]:
    """The design and each file's tensors; checks in numpy that the argmax is what the design says."""
    rng = np.random.default_rng(seed)
    vocab = build_vocab()
    nxt, like = successor_table(vocab, rng)
    embed = embeddings(vocab, like, rng)
    output = head_matrix(embed, nxt, vocab.pieces)
    if not np.array_equal(argmax_next(embed, output), nxt):
        raise RuntimeError("the synthetic output matrix does not pick the designed successor: change the seed")
    trunk = trunk_tensors(embed, output, rng)
    agree = np.concatenate([np.eye(N_EMBD), np.zeros((N_EMBD, N_EMBD))], axis=1)
    random_proj = rng.normal(0.0, 1.0 / np.sqrt(2 * N_EMBD), size=(N_EMBD, 2 * N_EMBD))
    half = half_table(vocab, nxt, like, rng)
    half_head = head_matrix(embed, half, vocab.pieces)
    if not np.array_equal(argmax_next(embed, half_head), half):
        raise RuntimeError("the synthetic half head does not pick its designed token: change the seed")
    heads = {
        "mtp-agreeing": mtp_tensors(agree, None, rng),
        "mtp-random": mtp_tensors(random_proj, None, rng),
        "mtp-half": mtp_tensors(agree, half_head, rng),
    }
    files = {name: {**trunk, **head} for name, head in heads.items()}
    files["mtp-half-context"] = {**files["mtp-half"], **recurrence_tensors(rng)}  # drawn last: the others unchanged
    design = Design(vocab, nxt, {"mtp-agreeing": nxt, "mtp-half": half, "mtp-half-context": half})
    return design, files


def write_all(outdir: Path, names: Iterable[str] = MTP_FILES + EAGLE3_HEADS, seed: int = SEED) -> dict[str, Path]:
    """Write the named files into outdir (made if missing); {name: path}."""
    outdir.mkdir(parents=True, exist_ok=True)
    design, files = build(seed)
    written: dict[str, Path] = {}
    for name in names:
        path = outdir / f"{name}.gguf"
        if name in EAGLE3_HEADS:
            write_head(path, name, seed)
        else:
            write_gguf(path, design.vocab, files[name], f"synthetic {name}")
        written[name] = path.resolve()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.measure.synthetic", description=__doc__.split("\n")[0])
    parser.add_argument("outdir", metavar="OUTDIR", type=Path, help="folder to write the .gguf files into")
    parser.add_argument("--json", action="store_true", help="end with one JSON line {name: path}")
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED})")
    args = parser.parse_args(argv)
    written = write_all(args.outdir, seed=args.seed)
    for name, path in written.items():
        print(f"{name:14} {path.stat().st_size:>9,} bytes  {path}")
    if args.json:
        print(json.dumps({name: str(path) for name, path in written.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
