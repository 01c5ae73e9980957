#!/usr/bin/env bash
# Create bench/.venv with the benchmark peers (cpprb, TorchRL, SB3) beside torch==2.13.0,
# then install replaystore itself (editable) if the repo root has a pyproject.toml.
#
# Usage: bash bench/setup_env.sh      (from anywhere; paths are relative to this script)
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "$0")" && pwd)"
REPO_ROOT="$(cd "$BENCH_DIR/.." && pwd)"
VENV="$BENCH_DIR/.venv"
BUILD_EXT="$BENCH_DIR/../../shared/tools/build_torchrl_ext.py"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check)

# 1. torch first, pinned, so nothing later can pull another torch.
"${PIP[@]}" "torch==2.13.0"
# setuptools + ninja-free build needs for the TorchRL extension rebuild.
"${PIP[@]}" --upgrade setuptools wheel

# 2. the peers (torch==2.13.0 is in the file too, so pip keeps it).
"${PIP[@]}" -r "$BENCH_DIR/requirements.txt"
# Lint tool for bench/.
"${PIP[@]}" ruff

# 3. rebuild TorchRL's C++ extension against torch 2.13 (PrioritizedSampler needs it).
if [ -f "$BUILD_EXT" ]; then
    "$PY" "$BUILD_EXT"
else
    echo "warning: $BUILD_EXT not found; TorchRL's PrioritizedSampler may not work" >&2
fi

# 4. replaystore itself, last, only if the package exists yet.
if [ -f "$REPO_ROOT/pyproject.toml" ]; then
    # The peers pinned as constraints, so the package can not move torch (or them).
    "${PIP[@]}" -c "$BENCH_DIR/requirements.txt" -e "$REPO_ROOT[fast]"   # [fast]: the numba sum trees
else
    echo "note: $REPO_ROOT/pyproject.toml not found; replaystore not installed (re-run later)" >&2
fi

# 5. guard: torch must still be 2.13.0.
"$PY" - <<'PYEOF'
import torch
assert torch.__version__.startswith("2.13.0"), f"torch was replaced: {torch.__version__}"
print("torch", torch.__version__)
PYEOF
