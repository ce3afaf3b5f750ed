"""Every benchmark script says what it does on ``--help`` and measures nothing.

Four of them once ignored ``--help`` and started a run (half an hour for the peer
benchmark) that overwrote the committed results. Each script runs from a copy of
``benchmarks/`` here, so that one that ignores ``--help`` again writes into the copy.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    path.name
    for path in (ROOT / "benchmarks").glob("*.py")
    if 'if __name__ == "__main__":' in path.read_text()
)
BOUND = 120.0
"""Seconds an answer to ``--help`` may take (imports on a loaded machine) before the
script is taken to be measuring."""
STOP_GRACE = 90.0
"""Seconds a script that was measuring gets to stop its servers once interrupted."""


@pytest.fixture(scope="module")
def benchmarks_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    skipped = shutil.ignore_patterns("results", "__pycache__")
    shutil.copytree(ROOT / "benchmarks", root / "benchmarks", ignore=skipped)
    shutil.copytree(ROOT / "examples", root / "examples", ignore=skipped)  # they import it
    return root / "benchmarks"


def test_the_scripts_are_found() -> None:
    assert {"batching_peers.py", "core_benchmark.py", "gpu_benchmark.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_describes_the_script_and_measures_nothing(benchmarks_copy: Path, script: str) -> None:
    script_run = subprocess.Popen(
        [sys.executable, str(benchmarks_copy / script), "--help"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=benchmarks_copy.parent,
        start_new_session=True,
    )
    try:
        stdout, stderr = script_run.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        _interrupt(script_run)
        pytest.fail(f"{script} --help was still running after {BOUND:g} s: it measures")
    assert script_run.returncode == 0, stderr
    assert stdout.startswith("usage: "), stdout[:500]
    written = [path for path in (benchmarks_copy / "results").rglob("*") if path.is_file()]
    assert not written, f"{script} --help wrote {written}"


def _interrupt(script_run: subprocess.Popen[str]) -> None:
    """Ctrl-C, so that the script stops the servers it started (each in a session of its
    own, out of reach of a signal to the script's group) before it goes; then SIGKILL."""
    os.killpg(script_run.pid, signal.SIGINT)
    try:
        script_run.communicate(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        os.killpg(script_run.pid, signal.SIGKILL)
        script_run.communicate()
