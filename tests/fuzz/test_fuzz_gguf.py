"""Fuzz: the GGUF header reader (engine/modelfiles/gguf_header.py). A small valid header written by the gguf
package, mutated (bytes flipped, truncated, counts and lengths made huge, types made unknown), and headers generated
key by key, are read, or refused with ModelFileError: never another exception. Nothing a header declares is
allocated before the file is known to hold it: reading a few-kB file never takes more than a few MiB
(tracemalloc's peak, a memory bound, not a time one)."""

import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.errors import ModelFileError
from engine.modelfiles.gguf_header import (
    metadata_problem,
    parse_gguf,
    read_gguf_header,
    read_gguf_metadata,
    read_gguf_tensors,
)

from support.fuzz_watchdog import bounded

FUZZ = settings.get_profile("specchat-fuzz")
MAX_PEAK_BYTES = 16 << 20  # a few-kB file's header: nothing near this is ever needed
TOKENS = ["<unk>", "<s>", "</s>", *[f"t{i}" for i in range(40)]]


def valid_header(path) -> bytes:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("fuzz")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * len(TOKENS))
    writer.add_token_types([gguf.TokenType.NORMAL] * len(TOKENS))
    writer.add_tensor("token_embd.weight", np.zeros((len(TOKENS), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> bytes:
    data = valid_header(tmp_path_factory.mktemp("gguf") / "valid.gguf")
    assert len(data) >= 1024
    return data


@pytest.fixture(scope="module")
def file_path(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzzed") / "fuzzed.gguf"


class Source:
    """A remote file's bytes (remote_gguf's kind of source), at most step bytes a read, whose size may lie."""

    def __init__(self, data: bytes, size: int, step: int):
        self.data, self.size, self.step = data, size, step

    def read(self, at: int, n: int) -> bytes:
        return self.data[at : at + max(min(n, 1 << 20), self.step)]


def read_everything(path, data: bytes, claimed_size: int, step: int) -> None:
    """Every reader over the file, each to its result or ModelFileError; the memory peak stays small."""
    tracemalloc.start()
    try:
        with bounded("the GGUF header reader"):
            for read in (read_gguf_header, read_gguf_metadata, read_gguf_tensors):
                try:
                    out = read(path)
                except ModelFileError as exc:
                    str(exc).encode("utf-8")
                    continue
                if read is read_gguf_metadata:
                    problem = metadata_problem(out, path.name)
                    assert problem is None or isinstance(problem, str)
            for tensors in (False, True):
                try:
                    meta, _ = parse_gguf(Source(data, claimed_size, step), "remote.gguf", tensors)
                except ModelFileError:
                    continue
                metadata_problem(meta, "remote.gguf")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_PEAK_BYTES, f"reading a {len(data):,}-byte file took {peak:,} bytes"


huge = st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 10**9, 10**12, 2**63 - 1, 2**63, 2**64 - 1])


@st.composite
def mutated(draw, base: bytes) -> bytes:
    data = bytearray(base)
    header_end = min(len(data), 2048)  # where the header's bytes are, in this small file
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "u64", "u32", "truncate", "insert", "delete"]))
        at = draw(st.integers(0, max(header_end - 1, 0)))
        if kind == "flip" and data:
            data[min(at, len(data) - 1)] ^= 1 << draw(st.integers(0, 7))
        elif kind == "u64" and at + 8 <= len(data):
            struct.pack_into("<Q", data, at, draw(huge))
        elif kind == "u32" and at + 4 <= len(data):
            struct.pack_into("<I", data, at, draw(st.one_of(st.integers(0, 15), st.just(2**32 - 1))))
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 16))]
    return bytes(data)


# --- headers generated key by key -----------------------------------------------------------------
def gguf_string(raw: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(raw) if length is None else length) + raw


SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@st.composite
def kv(draw) -> bytes:
    key = draw(
        st.one_of(
            st.sampled_from(
                [
                    b"general.architecture",
                    b"llama.block_count",
                    b"llama.expert_count",
                    b"llama.expert_used_count",
                    b"llama.rope.scaling.type",
                    b"tokenizer.ggml.tokens",
                    b"tokenizer.ggml.scores",
                    b"llama.nextn_predict_layers",
                ]
            ),
            st.binary(max_size=12),
        )
    )
    kind = draw(st.one_of(st.sampled_from([*SCALARS, 8, 9]), st.integers(0, 2**32 - 1)))
    out = gguf_string(key) + struct.pack("<I", kind)
    if kind in SCALARS:
        fmt = SCALARS[kind]
        size = struct.calcsize(fmt)
        return out + draw(st.binary(min_size=size, max_size=size))
    if kind == 8:
        raw = draw(st.one_of(st.sampled_from([b"llama", b"yarn", b"\xff\xfe", b""]), st.binary(max_size=8)))
        return out + gguf_string(raw, draw(st.one_of(st.none(), huge)))
    if kind == 9:
        item = draw(st.one_of(st.sampled_from([*SCALARS, 8, 9]), st.integers(0, 2**32 - 1)))
        items = draw(st.lists(st.binary(max_size=4), max_size=6))
        count = draw(st.one_of(st.just(len(items)), huge))
        if item == 8:
            body = b"".join(gguf_string(i) for i in items)
        elif item in SCALARS:
            size = struct.calcsize(SCALARS[item])
            body = b"".join(i.ljust(size, b"\0")[:size] for i in items)
        else:
            body = b"".join(items)
        return out + struct.pack("<IQ", item, count) + body
    return out + draw(st.binary(max_size=8))


@st.composite
def tensor_info(draw) -> bytes:
    dims = draw(st.one_of(st.integers(0, 4), st.sampled_from([9, 2**32 - 1])))
    shape = b"".join(struct.pack("<Q", draw(huge)) for _ in range(min(dims, 4)))
    return (
        gguf_string(draw(st.binary(max_size=10)), draw(st.one_of(st.none(), huge)))
        + struct.pack("<I", dims)
        + shape
        + struct.pack("<IQ", draw(st.integers(0, 2**32 - 1)), draw(huge))
    )


@st.composite
def generated(draw) -> bytes:
    kvs = draw(st.lists(kv(), max_size=6))
    tensors = draw(st.lists(tensor_info(), max_size=3))
    version = draw(st.sampled_from([2, 3, 3, 1, 4, 2**32 - 1]))
    n_tensors = draw(st.one_of(st.just(len(tensors)), huge))
    n_kvs = draw(st.one_of(st.just(len(kvs)), huge))
    data = (
        struct.pack(
            "<4sIQQ", draw(st.sampled_from([b"GGUF", b"GGUF", b"GGML", b"\0\0\0\0"])), version, n_tensors, n_kvs
        )
        + b"".join(kvs)
        + b"".join(tensors)
    )
    return data + b"\0" * draw(st.sampled_from([0, 1024 - len(data) % 1024, 4096]))


def check(path, data: bytes, size_lie: int, step: int) -> None:
    path.write_bytes(data)
    read_everything(path, data, len(data) + size_lie, step)


@settings(FUZZ, max_examples=150)
@given(st.data(), st.sampled_from([0, 0, 1 << 40]), st.sampled_from([64, 4096]))
def test_a_mutated_header_is_read_or_refused(base, file_path, data, size_lie, step):
    check(file_path, data.draw(mutated(base), label="file"), size_lie, step)


@settings(FUZZ, max_examples=100)
@given(generated(), st.sampled_from([0, 0, 1 << 40]), st.sampled_from([64, 4096]))
@example(
    struct.pack("<4sIQQ", b"GGUF", 3, 1, 2)
    + gguf_string(b"general.architecture")
    + struct.pack("<I", 8)
    + gguf_string(b"llama")
    + gguf_string(b"tokenizer.ggml.tokens")
    + struct.pack("<IIQ", 9, 4, 2)
    + struct.pack("<II", 7, 7)
    + b"\0" * 1024,
    0,
    4096,
)  # a vocabulary of numbers, one twice
def test_a_generated_header_is_read_or_refused(file_path, header, size_lie, step):
    check(file_path, header, size_lie, step)
