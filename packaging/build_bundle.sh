#!/usr/bin/env bash
# Builds the desktop bundle dist/SpecChat/ (executable: dist/SpecChat/specchat) from .venv with
# PyInstaller (packaging/specchat.spec), then runs its --smoke-test offscreen unless --no-smoke.
# Needs: bash packaging/install.sh first. Installs PyInstaller into .venv (the `bundle` extra).
# Takes several minutes and ~1.5 GB of disk; work files go to build/bundle/.
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=1
[ "${1:-}" = "--no-smoke" ] && smoke=0
py=.venv/bin/python
[ -x "$py" ] || { echo "no .venv: run 'bash packaging/install.sh' first" >&2; exit 1; }
"$py" -m PyInstaller --version >/dev/null 2>&1 || "$py" -m pip install -q -e ".[bundle]"
start=$(date +%s)
"$py" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath dist --workpath build/bundle packaging/specchat.spec
echo "built dist/SpecChat in $(( $(date +%s) - start )) s, $(du -sh dist/SpecChat | cut -f1)"
if [ "$smoke" = 1 ]; then
    # A scratch cache dir, as on a fresh machine: the default model is read from the bundle itself.
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    SPECCHAT_CACHE_DIR="$scratch/cache" QT_QPA_PLATFORM=offscreen dist/SpecChat/specchat --smoke-test
fi
