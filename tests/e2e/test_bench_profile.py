"""``ferry bench profile`` on the demo model: table, CSV, JSON and PNG."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ferry_bench.profile import MIN_RUNS, NOISY_SPREAD
from tests.fixtures.cli import run_ferry
from tests.fixtures.models import DEMO_STORE, ts_style_archive

pytestmark = pytest.mark.e2e
SAMPLES = DEMO_STORE.parent / "samples"


def test_profile_writes_csv_json_and_png(tmp_path: Path) -> None:
    inputs = f"{SAMPLES / 'star.png'},{SAMPLES / 'circle.png'}"
    run = run_ferry(
        "bench",
        "profile",
        str(DEMO_STORE / "shapes.mar"),
        "--input",
        inputs,
        "--batch-sizes",
        "1,2,4",
        "--precision",
        "fp32,bf16",
        "--seconds",
        "0.2",
        "--out",
        str(tmp_path),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "ms/item" in run.stdout
    assert "optimization: none" in run.stdout  # the demo archive switches none on
    with open(tmp_path / "profile.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert (tmp_path / "profile.csv").read_text().startswith("batch_size,")
    keys = {(r["batch_size"], r["variant"], r["precision"]) for r in rows}
    assert keys == {
        (str(b), v, p) for b in (1, 2, 4) for v in ("handler", "model") for p in ("fp32", "bf16")
    }
    for row in rows:
        _assert_consistent(row)
    assert _table(run.stdout) == {
        (r["batch_size"], r["variant"], r["precision"]): (
            f"{float(r['memory_mb']):.1f}",
            r["runs"],
            float(r["spread"]) > NOISY_SPREAD,
        )
        for r in rows
    }
    assert "torch threads" in run.stdout
    document = json.loads((tmp_path / "profile.json").read_text())
    assert document["model"] == "shapes.mar"
    # The same figures as the CSV, in the same order (csv writes a number as str() does).
    assert [{k: str(v) for k, v in point.items()} for point in document["points"]] == rows
    assert document["optimization"] == {}
    assert (tmp_path / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


ROUNDING_MS = 0.0005
"""The CSV's times are rounded to 0.001 ms: each is off by at most this."""


def _assert_consistent(row: dict[str, str]) -> None:
    """A CSV row's figures agree with one another, up to their rounding: spread and
    items/s are computed from the same timings as the percentiles."""
    batch, runs = int(row["batch_size"]), int(row["runs"])
    p10, median, p90 = (float(row[f"latency_ms_{q}"]) for q in ("p10", "median", "p90"))
    assert runs >= MIN_RUNS and 0 <= p10 <= median <= p90, row
    assert median > ROUNDING_MS, row  # else the bounds below say nothing
    width = p90 - p10
    low = (width - 2 * ROUNDING_MS) / (median + ROUNDING_MS) - 0.0005
    high = (width + 2 * ROUNDING_MS) / (median - ROUNDING_MS) + 0.0005
    assert low <= float(row["spread"]) <= high, row
    rate = batch * 1000 / median  # items/s are themselves rounded to 0.01
    assert abs(float(row["items_per_second"]) - rate) <= (
        rate * ROUNDING_MS / (median - ROUNDING_MS) + 0.005
    ), row
    assert float(row["memory_mb"]) >= 0, row  # growth of memory; a shrinking process is 0


def _table(stdout: str) -> dict[tuple[str, str, str], tuple[str, str, bool]]:
    """The printed table's +MB, runs and noisy flag by (batch, variant, precision)."""
    table: dict[tuple[str, str, str], tuple[str, str, bool]] = {}
    for line in stdout.splitlines():
        cells = line.split()
        if len(cells) in (9, 10) and cells[1] in ("handler", "model"):
            table[cells[0], cells[1], cells[2]] = (cells[7], cells[8], cells[9:] == ["noisy"])
    return table


def test_profile_refuses_bad_arguments(tmp_path: Path) -> None:
    png = str(SAMPLES / "star.png")
    for extra, message in (
        (["--batch-sizes", "0,2"], ">= 1"),
        (["--precision", "fp8"], "unknown precision"),
        (["--threads", "0"], "--threads must be at least 1"),
    ):
        run = run_ferry("bench", "profile", str(DEMO_STORE / "shapes.mar"), "--input", png, *extra)
        assert run.returncode == 2 and message in run.stderr
    missing = run_ferry("bench", "profile", str(tmp_path / "none.mar"), "--input", png)
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_an_input_the_model_cannot_read_is_named(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    run = run_ferry(
        "bench",
        "profile",
        str(DEMO_STORE / "shapes.mar"),
        "--input",
        f"{SAMPLES / 'star.png'},{text}",
        "--batch-sizes",
        "1",
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"--input {text}: the handler" in run.stderr


def test_a_torchserve_style_handler_profiles(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    archive = ts_style_archive(store)
    body = tmp_path / "row.json"
    body.write_text("[1, 2, 3]")
    run = run_ferry(
        "bench",
        "profile",
        str(store / archive),
        "--input",
        str(body),
        "--batch-sizes",
        "1,2",
        "--seconds",
        "0.1",
        "--threads",
        "1",
        "--out",
        "profiled",  # relative to the working directory
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "1 torch threads" in run.stdout and "ms/item" in run.stdout
    assert (tmp_path / "profiled" / "profile.csv").read_text().startswith("batch_size,")


def test_profile_measures_the_archive_at_its_own_precision(tmp_path: Path) -> None:
    """Without --precision, what the archive asks for (here bf16), as a worker runs it."""
    from ferry_bench.servers import with_precision

    archive = with_precision(DEMO_STORE / "shapes.mar", "bf16", tmp_path / "store")
    run = run_ferry(
        "bench",
        "profile",
        str(archive),
        "--input",
        str(SAMPLES / "star.png"),
        "--batch-sizes",
        "1,2",
        "--seconds",
        "0.1",
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "optimization: precision=bf16" in run.stdout
    rows = [line.split() for line in run.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 4 and {row[2] for row in rows} == {"bf16"}
