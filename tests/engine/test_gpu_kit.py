"""engine.measure.gpu_kit: random-weight GGUF files in real model shapes that the real llama.cpp loads and runs,
and a step-cost curve timed on this machine's backend (the CPU here; a GPU where the build has one)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.decoding.runtime import LoadSettings, Model
from engine.measure import gpu_kit

from support.this_build import BACKEND

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name, published", [("qwen2-0.5b", 0.494e9), ("qwen2-1.5b", 1.54e9), ("qwen2-7b", 7.62e9), ("llama3-8b", 8.03e9)]
)
def test_the_shapes_have_their_models_parameter_counts(name, published):
    assert gpu_kit.SHAPES[name].parameters == pytest.approx(published, rel=0.02)


@pytest.mark.slow
def test_a_real_shape_loads_in_llama_cpp_and_decodes(tmp_path):
    shape = gpu_kit.SHAPES["qwen2-0.5b"]
    path = gpu_kit.write(shape, tmp_path / "qwen2-0.5b.gguf")
    weights = shape.parameters * gpu_kit.QUANTS["Q4_0"][0] / gpu_kit.BLOCK
    assert weights < path.stat().st_size < weights * 1.1  # Q4_0 weights, little else
    with Model(path, LoadSettings(n_ctx=256, threads=2)) as model:
        assert model.n_vocab == 151936 and model.meta("general.architecture") == "qwen2"
        rows = model.decode([1, 400, 401, 402], 0, logits_rows=4)
        assert rows.shape == (4, 151936) and np.isfinite(rows).all()


@pytest.mark.slow
def test_curves_are_timed_on_this_backend_from_the_command_line(tmp_path):
    models = tmp_path / "kit"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.measure.gpu_kit",
            "write",
            "--out",
            str(models),
            "--shapes",
            "tiny-test",
            "--quant",
            "Q4_1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "curves.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.measure.gpu_kit",
            "curves",
            "--models",
            str(models),
            "--out",
            str(out),
            "--max-rows",
            "16",
            "--threads",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from engine.modelfiles.gguf_header import read_gguf_metadata

    assert read_gguf_metadata(models / "tiny-test.gguf")["general.file_type"] == 3  # llama.cpp's MOSTLY_Q4_1
    tiny = json.loads(out.read_text())["shapes"]["tiny-test"]
    assert tiny["backend"] == BACKEND and tiny["context_cells"] == 257
    seconds = {int(rows): s for rows, s in tiny["seconds_by_rows"].items()}
    assert sorted(seconds) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16]
    assert all(s > 0 for s in seconds.values()) and seconds[16] > seconds[1]  # 16 rows cost more than one


def test_an_unknown_shape_is_refused_by_name(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "engine.measure.gpu_kit", "write", "--out", str(tmp_path), "--shapes", "qwen9-700b"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "unknown shape qwen9-700b" in done.stderr and "qwen2-7b" in done.stderr
