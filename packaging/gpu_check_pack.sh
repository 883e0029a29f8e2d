#!/usr/bin/env bash
# Makes build/gpu-pack: what packaging/gpu_check.sh needs on a GPU machine without network, under 64 MiB.
#   - llama-cpp-python's source (this .venv's version) with the vendored llama.cpp trimmed to what a build reads
#     (no models, docs, tests, examples, web UI);
#   - wheels for what the engine and its tests import that such a machine lacks (pure Python, or built for
#     PY_VERSION, 3.12 by default).
# Run here, with PyPI reachable:  bash packaging/gpu_check_pack.sh [PY_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=${1:-3.12}
pack=build/gpu-pack
rm -rf "$pack" && mkdir -p "$pack/wheels" "$pack/src"
version=$(.venv/bin/python -c 'import llama_cpp; print(llama_cpp.__version__)')
.venv/bin/python -m pip download -q --no-deps --no-binary :all: -d "$pack/src" "llama-cpp-python==$version"
tar -xzf "$pack"/src/llama_cpp_python-*.tar.gz -C "$pack/src"
rm "$pack"/src/llama_cpp_python-*.tar.gz
root=$(echo "$pack"/src/llama_cpp_python-*)
# Only what a CUDA build reads: no git history, no web UI, no other GPU backends (each is its own subfolder,
# read only when its option is on), no models, docs, tests or benchmark results.
rm -rf "$root/.git" "$root/.github" "$root/examples" "$root/docker" "$root/docs"
(cd "$root/vendor/llama.cpp" && rm -rf .git .github .devops models docs tests examples media benches conversion \
  tools/ui tools/server/public* tools/server/webui tools/mtmd/legacy-models gguf-py/tests \
  ggml/src/ggml-{sycl,vulkan,opencl,hexagon,metal,et,cann,webgpu,zdnn,zendnn,openvino,virtgpu})
find "$root/vendor/llama.cpp" -name "*.gguf" -delete
tar -czf "$pack/$(basename "$root").tar.gz" -C "$pack/src" "$(basename "$root")"
rm -rf "$pack/src"
# The build's own tools (no build isolation offline), and what the engine, the doctor, the kit and the tests import
# that the machine lacks (it has numpy, torch, psutil, filelock, huggingface_hub). Installed there with --no-deps.
.venv/bin/python -m pip download -q --no-deps -d "$pack/wheels" --only-binary :all: --python-version "$pyver" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
  scikit-build-core pathspec packaging platformdirs diskcache jinja2 markupsafe typing-extensions \
  pytest pluggy iniconfig pytest-timeout gguf pyyaml tqdm
du -sh "$pack" && ls -la "$pack" "$pack/wheels"
