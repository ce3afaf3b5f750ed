#!/usr/bin/env bash
# Creates a virtual environment holding TorchServe 0.12.0 for tests/compat, which sends the
# same requests to TorchServe and to Ferry. Usage: scripts/torchserve-venv.sh [DIR]
# (default: .venv-torchserve at the repository root). A second run installs only what is
# missing, so it is safe to repeat.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.venv-torchserve}"
PYTHON="${PYTHON:-python3}"
# Always pinned: an unpinned torch resolves to a CUDA build of several gigabytes.
TORCH_PIN="torch==2.13.0"
TS_PACKAGES=(torchserve==0.12.0 torch-model-archiver pyyaml psutil packaging)
# TorchServe's vision handlers import these at module level (captum for explanations).
# torchvision is left out on purpose: where the only wheel at hand is a CUDA build, its
# operators fail to load beside a CPU torch and every import of it raises;
# tests/fixtures/torchserve.py supplies a stand-in when it is missing (see there).
EXTRA_PACKAGES=(pillow numpy captum lru-dict)

if [[ ! -x "$DIR/bin/python" ]]; then
    "$PYTHON" -m venv "$DIR"
fi
PY="$DIR/bin/python"

has() { "$PY" -c "import $1" >/dev/null 2>&1; }

install_torch() {
    # pip's configuration on this machine decides where the wheel comes from (a local CPU
    # wheel where there is one); the pin keeps it from resolving a CUDA build.
    if "$PY" -m pip install --quiet "$TORCH_PIN"; then
        return 0
    fi
    # Last resort: borrow the torch of Ferry's own environment. A .pth line is appended to
    # sys.path, so TorchServe's own packages (ts, model_archiver) are still found first.
    local ferry_site site
    ferry_site="$(ls -d "$ROOT"/.venv/lib/python3*/site-packages 2>/dev/null | head -n 1)"
    if [[ -z "$ferry_site" ]]; then
        echo "torch could not be installed and $ROOT/.venv has no site-packages" >&2
        exit 1
    fi
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$ferry_site" >"$site/ferry-torch.pth"
    echo "torch borrowed from $ferry_site (through $site/ferry-torch.pth)" >&2
}

# torch first, so that nothing installed after it (captum) pulls an unpinned torch.
if ! has torch; then
    install_torch
fi
if ! "$PY" -c 'import ts.version as v; assert v.__version__ == "0.12.0"' >/dev/null 2>&1 \
    || ! has model_archiver || ! has yaml || ! has psutil || ! has packaging || ! has PIL \
    || ! has numpy || ! has captum || ! has lru; then
    "$PY" -m pip install --quiet "${TS_PACKAGES[@]}" "${EXTRA_PACKAGES[@]}" "$TORCH_PIN"
fi

# torchvision's PIL transforms, the preprocessing TorchServe's vision handlers run, kept
# out of site-packages in a folder of its own: the side-by-side preprocessing tests import
# them with its compiled operators left unloaded (tests/fixtures/torchvision_reference.py),
# which is all PIL images need, and nothing else ever sees a torchvision that cannot load.
TORCHVISION_PIN="torchvision==0.28.0"
if [[ ! -d "$DIR/torchvision-pil/torchvision" ]]; then
    "$PY" -m pip install --quiet --no-deps --target "$DIR/torchvision-pil" "$TORCHVISION_PIN" \
        || echo "warning: torchvision could not be installed: the preprocessing parity tests will skip" >&2
fi

"$PY" - <<'PY'
import torch
import ts.version

print(f"TorchServe {ts.version.__version__}, torch {torch.__version__}")
PY
if ! command -v java >/dev/null 2>&1 && [[ -z "${JAVA_HOME:-}" ]]; then
    echo "warning: no java on PATH and no JAVA_HOME; TorchServe needs Java 11 or later" >&2
fi
echo "TorchServe environment ready in $DIR"
