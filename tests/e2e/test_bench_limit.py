"""``ferry bench limit`` as a user runs it, on the demo model."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.fixtures.cli import run_ferry
from tests.fixtures.models import DEMO_STORE

pytestmark = pytest.mark.e2e

SAMPLE = DEMO_STORE.parent / "samples" / "star.png"
CORE_USE = ("cores_busy", "generator_cores", "generator_ms", "server_main_ms", "server_workers_ms")
"""The figures of the report's "who used the cores" table, after the offered load."""


def test_limit_report_on_the_demo_model(tmp_path: Path) -> None:
    run = run_ferry(
        "bench",
        "limit",
        str(DEMO_STORE / "shapes.mar"),
        "--input",
        str(SAMPLE),
        "--slo-p99",
        "10s",
        "--batch-size",
        "4",
        "--fractions",
        "0.1,0.4",
        "--batch-policy",
        "immediate",
        "--duration",
        "1",
        "--profile-seconds",
        "0.2",
        "--out",
        "limit",  # relative to the working directory
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    out = tmp_path / "limit"
    report = json.loads((out / "limit.json").read_text())
    assert report["spec"]["batch_policy"] == "immediate"
    assert sorted(report["costs_ms"], key=int) == ["1", "2", "4"]
    limits = report["bounds"]
    assert limits["floor_ms"] > report["round_trip_ms"] > 0
    assert limits["ceiling_pipelined"] >= limits["ceiling_sequential"] > 0
    points = report["points"]
    assert [round(p["offered"] / limits["ceiling_sequential"], 3) for p in points] == [0.1, 0.4]
    for point in points:
        assert point["goodput"] > 0 and point["error_rate"] == 0
        assert point["ideal_p50_ms"] >= limits["floor_ms"] - 1e-6  # nothing beats the floor
        used = point["core_use"]  # the server was started here: its processes are measured
        assert used["cores_busy"] > 0 and used["generator_ms"] > 0
        # Its frontend's share may round to no clock tick, so 0 is a right answer; None
        # (not measured) is not. Its worker's (ms of model work for each of a second's
        # requests) cannot round to nothing.
        assert isinstance(used["server_main_ms"], float), used
        assert used["server_main_ms"] >= 0 and used["server_workers_ms"] > 0
    text = (out / "limit.md").read_text()
    # The report's core-use table shows these figures, one row per offered load, in order.
    assert _core_use_rows(text) == [
        [f"{p['offered']:.1f}", *(f"{p['core_use'][k]:.2f}" for k in CORE_USE)] for p in points
    ]
    assert set(report["ratios"]) == {
        "low_load_p50_minus_floor_ms",
        "peak_goodput_over_ceiling",
        "peak_goodput_over_pipelined_ceiling",
        "goodput_within_slo_over_slo_capacity",
    }
    assert "latency floor L0" in text and "| offered req/s |" in text
    assert "the load generator ran on the same machine as the server" in text
    assert "low-load p50 - L0" in run.stdout
    assert (out / "limit.png").read_bytes()[:4] == b"\x89PNG"


def _core_use_rows(markdown: str) -> list[list[str]]:
    """The cells of the "who used the cores" table's rows."""
    lines = markdown.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| offered req/s | cores"))
    rows = []
    for line in lines[header + 2 :]:  # past the |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_limit_against_a_server_that_is_not_there(tmp_path: Path) -> None:
    with socket.socket() as unused:  # bound, never listening
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}/predictions/shapes"
        run = run_ferry(
            "bench",
            "limit",
            str(DEMO_STORE / "shapes.mar"),
            "--input",
            str(SAMPLE),
            "--slo-p99",
            "1s",
            "--batch-size",
            "2",
            "--profile-seconds",
            "0.1",
            "--url",
            url,
            "--out",
            str(tmp_path / "out"),
            timeout=300,
        )
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "warm-up: no request succeeded" in run.stderr
