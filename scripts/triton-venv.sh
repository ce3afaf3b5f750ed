#!/usr/bin/env bash
# Creates a virtual environment holding NVIDIA Triton Inference Server (its CPU build,
# through PyTriton) for the peer benchmark, benchmarks/batching_peers.py. Usage:
# scripts/triton-venv.sh [DIR] (default: .venv-triton at the repository root; ~1.3 GB).
# Safe to repeat.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.venv-triton}"
# Triton's Python backend embeds the system's libpython: a venv from another build of the
# same version (pyenv's, say) mixes two standard libraries and its models fail to load.
PYTHON="${PYTHON:-/usr/bin/python3.11}"
if [[ ! -x "$DIR/bin/python" ]]; then
  "$PYTHON" -m venv "$DIR"
fi
# Always pinned: an unpinned torch resolves to a CUDA build of several gigabytes.
"$DIR/bin/pip" install --quiet nvidia-pytriton torch==2.13.0 pillow numpy
echo "Triton environment ready: $DIR"
