"""gguf_header parses from any source with size and read(at, n): a source that hands out a few KB at a
time gives what the mapped local file gives, and counts a file cannot hold are refused, naming the key,
before any loop runs over them."""

import struct
from pathlib import Path

import pytest

from engine.errors import ModelFileError
from engine.modelfiles import gguf_header
from engine.modelfiles.embedded import embedded_model_path
from engine.modelfiles.gguf_header import parse_gguf, read_gguf_metadata, read_gguf_tensors


class Trickle:
    """A source that hands out at most `step` bytes per read and records each read."""

    def __init__(self, data: bytes, step: int = 4096):
        self.data, self.size, self.step, self.reads = data, len(data), step, []

    def read(self, at: int, n: int) -> bytes:
        self.reads.append((at, n))
        return self.data[at : at + max(n, self.step)]


def test_a_source_read_piece_by_piece_gives_what_the_mapped_file_gives():
    path = embedded_model_path()
    head = path.read_bytes()[: 8 << 20]  # the whole header and more; size stays the file's
    source = Trickle(head, step=64 * 1024)
    source.size = path.stat().st_size
    meta, _ = parse_gguf(source, path.name)
    assert meta == read_gguf_metadata(path) and len(meta["tokenizer.ggml.tokens"]) == 49152
    assert len(source.reads) > 10 and all(at + n <= len(head) for at, n in source.reads)
    _, tensors = parse_gguf(Trickle(head, step=64 * 1024), path.name, tensors=True)
    assert tensors == read_gguf_tensors(path)  # every tensor entry lies within the first 8 MB too


def patched(tiny: Path, key: bytes, after_key: int, value: int) -> bytes:
    data = bytearray(tiny.read_bytes())
    struct.pack_into("<Q", data, data.index(key) + len(key) + after_key, value)
    return bytes(data)


@pytest.mark.parametrize(
    "key, message",
    [
        (b"tokenizer.ggml.tokens", "tokenizer.ggml.tokens claims 1,000,000,000 strings"),
        (
            b"tokenizer.ggml.scores",
            "tokenizer.ggml.scores claims 1,000,000,000 entries, more than the rest of the file",
        ),
    ],
)
def test_a_count_the_file_cannot_hold_names_its_key(tiny, tmp_path, key, message, monkeypatch):
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(patched(tiny, key, 4 + 4, 1_000_000_000))  # past the value type and the item type
    loops, reader = [], gguf_header._Reader  # every count a loop over strings was started with

    def spied(real):
        def loop(self, count):
            loops.append(count)
            assert count < 1_000_000_000, "the claimed count was looped over, not refused"
            return real(self, count)

        return loop

    monkeypatch.setattr(reader, "_strings", spied(reader._strings))
    monkeypatch.setattr(reader, "_skip_strings", spied(reader._skip_strings))
    with pytest.raises(ModelFileError, match=message):
        read_gguf_metadata(damaged)
    assert len(read_gguf_metadata(tiny)["tokenizer.ggml.tokens"]) in loops  # (the spy sees the loops there are)


def test_a_tensor_count_the_file_cannot_hold(tiny, tmp_path):
    data = bytearray(tiny.read_bytes())
    struct.pack_into("<Q", data, 8, 900_000)  # tensor count: 900k tensors in a few KB
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(bytes(data))
    assert read_gguf_metadata(damaged)["tokenizer.ggml.tokens"]  # the metadata alone still reads
    with pytest.raises(ModelFileError, match="claims 900,000 tensors"):
        read_gguf_tensors(damaged)
