"""``ferry bench sweep`` and ``ferry bench tune`` end to end on a tiny model."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from tests.fixtures.cli import run_ferry
from tests.fixtures.models import digest_archive

pytestmark = pytest.mark.e2e


@pytest.fixture
def model(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    return store / digest_archive(store, "echo")


def test_sweep_writes_csv_markdown_and_plot(tmp_path: Path, model: Path) -> None:
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"hello")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "model": str(model),
                "input": [str(payload)],
                "batch_size": [1, 4],
                "max_batch_delay": [5],
                "workers": [1],
                "concurrency": [1, 4],
                "requests": 60,
            }
        )
    )
    out = tmp_path / "out"
    run = run_ferry("bench", "sweep", str(spec), "--out", str(out), timeout=600)
    assert run.returncode == 0, run.stderr
    with open(out / "sweep.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4
    assert {
        "Throughput",
        "Latency P50",
        "Latency P90",
        "Latency P99",
        "Latency mean",
        "Error rate",
        "Batch size",
        "Batch delay",
        "Workers",
        "Concurrency",
        "Model_p50",
        "Model_p99",
        "Queue time p50",
        "Queue time p99",
    } <= set(rows[0])
    assert all(float(r["Throughput"]) > 0 and r["Error rate"] == "0.0" for r in rows)
    assert {(r["Batch size"], r["Concurrency"]) for r in rows} == {
        ("1", "1"),
        ("1", "4"),
        ("4", "1"),
        ("4", "4"),
    }
    assert "| Batch size |" in (out / "sweep.md").read_text()
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_tune_writes_the_model_config_to_use(tmp_path: Path, model: Path) -> None:
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"hello")
    out = tmp_path / "tune"
    run = run_ferry(
        "bench",
        "tune",
        str(model),
        "--slo-p99",
        "60s",  # met by every configuration however busy the machine: no speed is asserted
        "--input",
        str(payload),
        "--batch-sizes",
        "1,4",
        "--delays",
        "5",
        "--workers",
        "1",
        "--concurrency",
        "1,4",
        "--requests",
        "60",
        "--out",
        str(out),
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    chosen = yaml.safe_load((out / "model-config.yaml").read_text())
    assert chosen["batchSize"] in (1, 4) and chosen["minWorkers"] == 1
    assert "| rank |" in run.stdout and (out / "tune.png").exists()
    impossible = run_ferry(
        "bench",
        "tune",
        str(model),
        "--slo-p99",
        "0.001ms",  # one microsecond: no HTTP round trip is that fast
        "--input",
        str(payload),
        "--batch-sizes",
        "1",
        "--delays",
        "5",
        "--workers",
        "1",
        "--concurrency",
        "1",
        "--requests",
        "20",
        "--out",
        str(tmp_path / "none"),
        timeout=600,
    )
    assert impossible.returncode == 1 and "no configuration met" in impossible.stdout
