#!/usr/bin/env bash
# Installs Ferry into a virtual environment. The one install path for development and CI
# (`make venv`, mode dev) and for the container image (Dockerfile, mode runtime).
#
#   scripts/install.sh VENV dev       torch pinned by requirements-dev.txt, the test tools,
#                                     Ferry editable with every extra
#   scripts/install.sh VENV runtime   torch==$TORCH_VERSION from $TORCH_INDEX_URL (when set:
#                                     the CPU or a CUDA index), Ferry with the grpc and
#                                     explain extras
set -euo pipefail

VENV="${1:?usage: scripts/install.sh VENV dev|runtime}"
MODE="${2:?usage: scripts/install.sh VENV dev|runtime}"
PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet)
case "$MODE" in
    dev)
        "${PIP[@]}" -r "$ROOT/requirements-dev.txt"
        "${PIP[@]}" -e "$ROOT[bench,onnx,explain,grpc,ray,otel]"
        ;;
    runtime)
        # torch first and pinned, so that installing Ferry keeps this build of it.
        "${PIP[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
            "torch==${TORCH_VERSION:-2.13.0}"
        # The build asked for, not one pip fell back to (a CUDA index without that version).
        "$VENV/bin/python" "$ROOT/scripts/check_torch_build.py" \
            "${TORCH_VERSION:-2.13.0}" "${TORCH_INDEX_URL:-}"
        "${PIP[@]}" "$ROOT[grpc,explain]"
        ;;
    *)
        echo "scripts/install.sh: mode must be dev or runtime, not $MODE" >&2
        exit 2
        ;;
esac
