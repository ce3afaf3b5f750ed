#!/usr/bin/env bash
# Regenerate Ferry's gRPC modules (ferry/grpc/generated/) from ferry/grpc/protos/*.proto.
#
#   scripts/generate-grpc.sh [OUT_DIR]      (default: ferry/grpc/generated)
#
# Needs grpcio-tools and googleapis-common-protos (requirements-dev.txt, the grpc extra).
# The .proto files are compiled as if they lay in ferry/grpc/generated/, so the modules
# import each other as ferry.grpc.generated.*; tests/unit/test_grpc_generated.py runs this
# script into a temporary folder and fails when the committed modules differ.
#
# Every .proto in ferry/grpc/protos/ is compiled: TorchServe's two APIs and the Open
# Inference Protocol's (ferry_open_inference.proto, package ``inference``). The latter's
# modules collide with tritonclient.grpc's and kserve's in one process, so nothing here
# imports the generated modules; the test compares them as files.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
PYTHON="$(realpath -s "$(command -v "$PYTHON")")"
OUT="$(realpath -m "${1:-ferry/grpc/generated}")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/ferry/grpc/generated" "$work/out"
cp ferry/grpc/protos/*.proto "$work/src/ferry/grpc/generated/"

# googleapis-common-protos ships google/rpc/status.proto beside its modules.
googleapis="$("$PYTHON" -c 'import google.rpc, os; print(os.path.dirname(os.path.dirname(google.rpc.__path__[0])))')"

(
  cd "$work/src"
  "$PYTHON" -m grpc_tools.protoc -I . -I "$googleapis" \
    --python_out="$work/out" --pyi_out="$work/out" --grpc_python_out="$work/out" \
    ferry/grpc/generated/*.proto
)
mkdir -p "$OUT"
cp "$work"/out/ferry/grpc/generated/* "$OUT/"
