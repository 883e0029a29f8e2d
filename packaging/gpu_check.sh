#!/usr/bin/env bash
# The GPU check in one run, for a bare NVIDIA machine without network (like the lent one: CUDA's nvcc, CMake,
# ninja, Python with torch, numpy, psutil and huggingface_hub; no PySide6). It writes OUT/report.json:
#   engine.doctor (backend, devices, VRAM reader, layers on the GPU, a bench), the GPU kit's step-cost curves for
#   four real model shapes, the sampling math timed on the CPU and on CUDA, what lookup, draft and auto would gain
#   there on the Qwen2.5-Coder pair's answers recorded on a CPU (a prediction), the built-in drafters (greedy
#   --method mtp beside none on the synthetic MTP files, every layer offloaded; also on a real model with MTP layers
#   named by SPECCHAT_MTP_MODEL, and an EAGLE-3 pair by SPECCHAT_EAGLE3_TARGET and SPECCHAT_EAGLE3_HEAD), and the
#   engine tests that run there.
#
#   bash packaging/gpu_check.sh OUT         on the GPU machine: builds llama-cpp-python with -DGGML_CUDA=on for
#                                           this GPU's architecture only, from the pack that
#                                           packaging/gpu_check_pack.sh made here (build/gpu-pack, < 64 MiB)
#   bash packaging/gpu_check.sh --cpu OUT   anywhere, on this project's .venv: no build, small shapes (CI runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=gpu
[ "${1:-}" = "--cpu" ] && { mode=cpu; shift; }
out=$(mkdir -p "${1:?usage: gpu_check.sh [--cpu] OUT}" && cd "$1" && pwd)
pack=${GPU_PACK:-build/gpu-pack}
log() { echo "[gpu_check $(date +%H:%M:%S)] $*" >&2; }

if [ "$mode" = gpu ]; then
  venv=${GPU_VENV:-/tmp/specchat-gpu-venv}
  # The machine's own torch, numpy and psutil; the rest from the pack's wheels, offline.
  [ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
  py="$venv/bin/python"
  "$py" -m pip install -q --no-index --no-deps "$pack"/wheels/*.whl
  if ! "$py" -c 'import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 1)' 2>/dev/null; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
    # GPU_CHECK_BACKEND_ARGS replaces the CUDA flags, to try the offline build on a machine without CUDA.
    backend=${GPU_CHECK_BACKEND_ARGS:--DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${arch}}
    log "building llama-cpp-python ($backend) on $(nproc) cores"
    CMAKE_ARGS="$backend -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      "$py" -m pip install -q --no-index --no-build-isolation --no-deps "$pack"/llama_cpp_python-*.tar.gz \
      > "$out/build.log" 2>&1 || { tail -50 "$out/build.log" >&2; exit 1; }
    log "built"
  fi
  shapes=qwen2-0.5b,qwen2-1.5b,qwen2-7b,llama3-8b
  target=qwen2-1.5b draft=qwen2-0.5b max_rows=64 bench_rounds=2
  predict_target=qwen2-1.5b predict_draft=qwen2-0.5b  # the pair's own shapes
  tests=(tests/engine/test_gpu_kit.py tests/engine/test_verifier.py)
  kit=${GPU_KIT_DIR:-/tmp/specchat-gpu-kit}
  drafter_args=(--require-gpu)  # a head or target left on the CPU fails the check
else
  py=.venv/bin/python
  shapes=tiny-test,qwen2-0.5b
  target=tiny-test draft=tiny-test max_rows=16 bench_rounds=1  # small and one round: the path, quickly
  predict_target=qwen2-0.5b predict_draft=tiny-test
  tests=(tests/engine/test_gpu_kit.py)  # the verifier's run in the suite already
  kit="$out/kit"
  drafter_args=()
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the engine from this tree, installed or not

log "doctor (system)"
"$py" -m engine.doctor --json --no-model > "$out/doctor-system.json"
log "kit: writing $shapes"
"$py" -m engine.measure.gpu_kit write --out "$kit" --shapes "$shapes"
log "kit: curves up to $max_rows rows"
"$py" -m engine.measure.gpu_kit curves --models "$kit" --out "$out/curves.json" --max-rows "$max_rows"
log "kit: sampling math by device"
"$py" -m engine.measure.gpu_kit sampling --out "$out/sampling.json"
# Answers recorded here with the real pair (python -m engine.measure.replay record --draft, docs/gpu-check.md).
recording=resources/recordings/qwen2.5-coder-pair-heldout.json
log "replay: the pair's recorded answers on $predict_target's curve, drafted on $predict_draft's"
"$py" -m engine.measure.replay replay "$recording" --curves "$out/curves.json" --shape "$predict_target" \
  --draft-shape "$predict_draft" --host-time --out "$out/prediction.json" > "$out/prediction.txt"
# The kit's files are random: the bench's speeds are real, its acceptance says nothing about real models.
doctor_draft=()
[ "$mode" = gpu ] && doctor_draft=(--draft "$kit/$draft.gguf")
log "doctor (random-weight $target${doctor_draft:+, draft $draft})"
"$py" -m engine.doctor --json --model "$kit/$target.gguf" "${doctor_draft[@]}" --rounds "$bench_rounds" > "$out/doctor-model.json"
[ -n "${SPECCHAT_MTP_MODEL:-}" ] && drafter_args+=(--model "$SPECCHAT_MTP_MODEL")
[ -n "${SPECCHAT_EAGLE3_TARGET:-}" ] && drafter_args+=(--pair "$SPECCHAT_EAGLE3_TARGET" "${SPECCHAT_EAGLE3_HEAD:?with SPECCHAT_EAGLE3_TARGET}")
log "drafters: mtp beside none on the synthetic files${SPECCHAT_MTP_MODEL:+ and $SPECCHAT_MTP_MODEL}"
set +e
"$py" -m engine.measure.drafter_check --out "$out/drafters.json" --synthetic "$out/synthetic" "${drafter_args[@]}" \
  > "$out/drafters.txt" 2>&1
drafters_rc=$?
log "engine tests that need neither Qt nor the embedded models"
"$py" -m pytest -q -p no:cacheprovider -m "" "${tests[@]}" > "$out/tests.txt" 2>&1  # -m "": slow tests too
tests_rc=$?
set -e
"$py" - "$out" "$mode" "$tests_rc" "$drafters_rc" <<'EOF'
import json, sys
from pathlib import Path
out, mode, rc, drafters_rc = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
report = {"mode": mode, "tests": {"returncode": rc, "summary": (out / "tests.txt").read_text().strip().splitlines()[-1:]}}
drafters = out / "drafters.json"  # absent when the check died before writing it (drafters.txt says why)
report["drafters"] = json.loads(drafters.read_text()) if drafters.exists() else {"returncode": drafters_rc}
for name in ("doctor-system", "doctor-model", "curves", "sampling", "prediction"):
    report[name] = json.loads((out / f"{name}.json").read_text())
(out / "report.json").write_text(json.dumps(report, indent=1))
print(json.dumps({"mode": mode, "backend": report["doctor-model"]["llama_cpp"]["backend"],
                  "layers_on_gpu": report["doctor-model"]["model"]["layers_on_gpu"], "tests": report["tests"],
                  "drafters": {r["name"]: {k: r.get(k) for k in ("ok", "identical", "drafted", "accepted", "error")
                                           if k in r} for r in report["drafters"].get("rows", [])} or report["drafters"],
                  "predicted_speed_ups": {m: round(x, 2) for m, x in report["prediction"]["geomean"].items()
                                          if m in ("lookup", "draft", "auto")}}))  # the bounds are not predictions
EOF
[ "$drafters_rc" = 0 ] || { log "drafters failed ($out/drafters.txt):"; tail -20 "$out/drafters.txt" >&2; exit 1; }
exit "$tests_rc"
