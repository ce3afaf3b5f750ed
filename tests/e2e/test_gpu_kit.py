"""The GPU kit's dry run (issue 49): proof, on a machine without a GPU, that nothing is
missing when a GPU machine comes.

``make gpu-kit``'s build (into a temporary folder, from the package index), then the kit's
own entry script with ``--dry-run``: the same pinned wheels, built for this Python,
installed into a fresh private folder with ``--no-index``; the preflight imports every
module the parts need (the carried ones from that folder) and starts ``ferry serve``; each
GPU part imports what it runs and SKIPs for want of a GPU, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_kit.parts import RESULT_FILES_LIMIT, kit_parts

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DRY_RUN_BOUND = 120.0
"""Seconds the dry run may take (measured here: 16, the download included)."""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the kit would measure")
def test_the_dry_run_installs_the_set_and_every_gpu_part_skips_with_its_reason(
    tmp_path: Path,
) -> None:
    kit, out = tmp_path / "kit", tmp_path / "out"
    build = [sys.executable, "-m", "benchmarks.gpu_kit", "build", "--kit", str(kit)]
    subprocess.run(build, cwd=ROOT, check=True, timeout=DRY_RUN_BOUND)
    start = time.monotonic()
    run = subprocess.run(
        ["bash", str(kit / "run.sh"), "--dry-run"],
        cwd=ROOT,
        env={**os.environ, "OUT": str(out), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=DRY_RUN_BOUND,
    )
    took = time.monotonic() - start
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = (out / "kit.md").read_text()
    table, _, pages = summary.partition("\n\n## ")  # the outcomes, then inline pages
    rows = {
        cells[0]: cells[1:]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith(("| part", "|---"))
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
    }
    parts = kit_parts(sys.executable, "")
    assert list(rows) == [part.name for part in parts]
    assert rows["preflight"][0] == "PASS", summary
    for part in parts[1:]:
        status, _, reason, _ = rows[part.name]
        assert status == "SKIP", summary
        assert "no CUDA GPU" in reason, summary
    # The preflight's page is in kit.md (one of the 8 files saved for the parts' pages).
    assert pages.startswith("preflight\n"), summary
    for package in ("starlette", "uvicorn", "httptools", "python-multipart"):
        assert package in pages
    assert "ferry serve ready" in pages
    written = sorted(path.name for path in out.iterdir())
    assert {"kit.md", "kit.log", "gpu_checks.md"} <= set(written)
    assert "environment.md" not in written
    assert len(written) <= RESULT_FILES_LIMIT
    assert "SKIP" in (out / "gpu_checks.md").read_text()
    print(f"dry run: {took:.1f} s")
