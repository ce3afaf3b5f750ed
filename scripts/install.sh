#!/usr/bin/env bash
# Installs Ferry into a virtual environment. The one install path for development and CI
# (`make venv`, mode dev) and for the container image (Dockerfile, modes torch, runtime).
#
#   scripts/install.sh VENV dev       torch pinned by requirements-dev.txt, the test tools,
#                                     Ferry editable with every extra, and ferry-bench
#                                     (bench/, the bench extra's) editable from the checkout
#   scripts/install.sh VENV torch     torch==$TORCH_VERSION and torchvision==$TORCHVISION_VERSION
#                                     from $TORCH_INDEX_URL (when set: the CPU or a CUDA
#                                     index; else pip's own), the pair checked
#   scripts/install.sh VENV runtime   Ferry with the grpc and explain extras (after
#                                     `torch`; it runs that first if the venv has no torch)
set -euo pipefail

VENV="${1:?usage: scripts/install.sh VENV dev|torch|runtime}"
MODE="${2:?usage: scripts/install.sh VENV dev|torch|runtime}"
PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet)
case "$MODE" in
    dev)
        "${PIP[@]}" -r "$ROOT/requirements-dev.txt"
        # ./bench given beside the bench extra is the ferry-bench pip takes for it: no index
        # has it (released together, the two pin each other at one version).
        "${PIP[@]}" -e "$ROOT[bench,onnx,explain,grpc,ray,otel]" -e "$ROOT/bench"
        ;;
    torch)
        # Pinned together, so that installing Ferry keeps these builds.
        "${PIP[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
            "torch==${TORCH_VERSION:-2.13.0}" "torchvision==${TORCHVISION_VERSION:-0.28.0}"
        # The builds asked for, not ones pip fell back to (a CUDA index without that version).
        "$VENV/bin/python" "$ROOT/scripts/check_torch_build.py" \
            "${TORCH_VERSION:-2.13.0}" "${TORCH_INDEX_URL:-}" \
            --torchvision "${TORCHVISION_VERSION:-0.28.0}"
        ;;
    runtime)
        if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
            "$0" "$VENV" torch
        fi
        "${PIP[@]}" "$ROOT[grpc,explain]"
        ;;
    *)
        echo "scripts/install.sh: mode must be dev, torch or runtime, not $MODE" >&2
        exit 2
        ;;
esac
