#!/usr/bin/env bash
# Builds Ferry's container image with podman (as root), the way `make image` does:
#
#   scripts/image.sh [IMAGE]                     default IMAGE: localhost/ferry:latest
#
# TORCH_INDEX_URL picks the torch and torchvision builds (the pair is checked):
#   unset or empty      the index pip is configured with here (PyPI: its default builds,
#                       CUDA-capable, which run on a CPU too)
#   .../whl/cpu         the CPU builds (the small image), .../whl/cu128 CUDA 12.8, ...
#
# Without Docker Hub, the base image is Debian bookworm made with debootstrap (once; kept
# as localhost/ferry-base:bookworm). pip inside the build reads this host's pip settings
# and the folders they name (scripts/pip_context.py), read-only, with the host's network.
# runc runs the build's steps (crun refuses cgroup layouts such as this VM's).
set -euo pipefail

IMAGE="${1:-localhost/ferry:latest}"
BASE="${FERRY_BASE_IMAGE:-localhost/ferry-base:bookworm}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNC="$(command -v runc || true)"

for tool in podman debootstrap; do
    if ! command -v "$tool" >/dev/null; then
        echo "scripts/image.sh: $tool is missing: apt-get install podman runc debootstrap" >&2
        exit 2
    fi
done
if [[ -z "$RUNC" ]]; then
    echo "scripts/image.sh: runc is missing: apt-get install runc" >&2
    exit 2
fi

if ! podman image exists "$BASE"; then
    rootfs="$(mktemp -d)"
    trap 'rm -rf "$rootfs"' EXIT
    echo "scripts/image.sh: making the base image $BASE with debootstrap (a few minutes, once)"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates,curl \
        bookworm "$rootfs" >/dev/null
    tar -C "$rootfs" -c . | podman import - "$BASE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
fi

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
skip=()
# A local torch build in a wheel folder would win over the index's by its version label.
[[ -z "${TORCH_INDEX_URL:-}" ]] && skip=(--skip-find-links)
mapfile -t mounts < <(python3 "$ROOT/scripts/pip_context.py" "$context" "${skip[@]}")

podman build \
    --runtime "$RUNC" \
    --network host \
    --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 \
    "${mounts[@]}" \
    --build-arg PYTHON_IMAGE="$BASE" \
    --build-arg TORCH_INDEX_URL="${TORCH_INDEX_URL:-}" \
    ${TORCH_VERSION:+--build-arg TORCH_VERSION="$TORCH_VERSION"} \
    ${TORCHVISION_VERSION:+--build-arg TORCHVISION_VERSION="$TORCHVISION_VERSION"} \
    -t "$IMAGE" \
    "$ROOT"
podman image prune --force >/dev/null  # the untagged images earlier builds left
podman image inspect "$IMAGE" --format '{{.Size}}' \
    | awk -v image="$IMAGE" '{ printf "scripts/image.sh: built %s, %.2f GB\n", image, $1 / 1e9 }'
