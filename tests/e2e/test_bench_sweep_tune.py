"""``ferry bench sweep`` and ``ferry bench tune`` end to end on a tiny model."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.fixtures.cli import FERRY, run_ferry
from tests.fixtures.models import DEMO_STORE, digest_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.processes import children_of, is_running
from tests.fixtures.server import ferry_server

DEMO_SAMPLES = DEMO_STORE.parent / "samples"

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
    run = run_ferry("bench", "sweep", "spec.yaml", "--out", "out", timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "[4/4] batch 4 delay 5 workers 1 fp32 c4:" in run.stderr and "left" in run.stderr
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


def test_a_configuration_that_cannot_start_is_reported_not_raised(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "model": str(DEMO_STORE / "shapes.mar"),
                "input": [str(DEMO_SAMPLES / "star.png")],
                "server": "torchserve",
                "precision": ["fp16"],  # a Ferry setting: TorchServe cannot be asked for it
                "concurrency": [1, 2],
            }
        )
    )
    run = run_ferry("bench", "sweep", str(spec), "--out", str(tmp_path / "out"), timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "failed: a precision other than fp32 is a Ferry setting" in run.stderr
    assert "2 of 2 points failed" in run.stderr
    with open(tmp_path / "out" / "sweep.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["Error"] for r in rows] == ["a precision other than fp32 is a Ferry setting"] * 2


def test_tune_merges_into_the_archive_config_and_writes_a_ready_archive(tmp_path: Path) -> None:
    run = run_ferry(
        "bench",
        "tune",
        str(DEMO_STORE / "shapes.mar"),
        "--slo-p99",
        "60s",  # met by every configuration however busy the machine: no speed is asserted
        "--input",
        str(DEMO_SAMPLES / "star.png"),
        "--batch-sizes",
        "1,2",
        "--delays",
        "5,10",
        "--workers",
        "1",
        "--concurrency",
        "1,2",
        "--requests",
        "40",
        "--out",
        "tuned",  # relative: the README's form
        "--archive",
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "p99 rests on the slowest" in run.stderr  # 40 requests are too few for p99
    # batch size 1 never waits for its delay: measured with the first delay only
    assert run.stderr.count("batch 1 delay 10") == 0 and "batch 2 delay 10" in run.stderr
    out = tmp_path / "tuned"
    chosen = yaml.safe_load((out / "model-config.yaml").read_text())
    with zipfile.ZipFile(DEMO_STORE / "shapes.mar") as archive:
        original = yaml.safe_load(archive.read("model-config.yaml"))
    assert chosen["image_classifier"] == original["image_classifier"]
    assert chosen["responseTimeout"] == original["responseTimeout"]
    assert chosen["batchSize"] in (1, 2) and chosen["minWorkers"] == 1
    assert "| Precision |" in run.stdout and "batchSize: " in run.stdout
    assert (out / "tune.png").read_bytes()[:4] == b"\x89PNG"
    store = tmp_path / "store"
    store.mkdir()
    (out / "shapes.mar").rename(store / "shapes.mar")
    with ferry_server(store, ["shapes.mar"], tmp_path) as server, server.client() as http:
        for shape in ("star", "circle", "cross", "triangle"):
            body = (DEMO_SAMPLES / f"{shape}.png").read_bytes()
            answer = http.post("/predictions/shapes", content=body).json()
            assert max(answer, key=answer.get) == shape


def test_tune_refuses_too_few_requests_for_its_concurrency(tmp_path: Path) -> None:
    run = run_ferry(
        "bench",
        "tune",
        str(DEMO_STORE / "shapes.mar"),
        "--slo-p99",
        "1s",
        "--input",
        str(DEMO_SAMPLES / "star.png"),
        "--concurrency",
        "1,64",
        "--requests",
        "32",
    )
    assert run.returncode == 2 and "fewer than the highest concurrency 64" in run.stderr


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


def _serving_child(pid: int) -> int | None:
    """A ``ferry serve`` that process ``pid`` started, if one runs."""
    for child in children_of(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in command:
            return child
    return None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_stops_tune_and_the_server_it_started(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Issue 47, item 8: SIGTERM left tune's ``ferry serve`` running; Ctrl-C stopped it
    but printed some 65 lines of traceback."""
    out, output = tmp_path / "out", tmp_path / "output.txt"
    command = [
        *FERRY,
        *("bench", "tune", str(DEMO_STORE / "shapes.mar"), "--slo-p99", "50ms"),
        *("--input", str(DEMO_SAMPLES / "star.png"), "--out", str(out)),
    ]
    with output.open("w") as written:
        tune = subprocess.Popen(command, stdout=written, stderr=subprocess.STDOUT)
    server = None
    try:
        wait_until("tune's server", lambda: _serving_child(tune.pid) is not None, process=tune)
        server = _serving_child(tune.pid)
        logs = out / "servers"
        wait_until(
            "its server to listen",
            lambda: any("API listening" in log.read_text() for log in logs.rglob("server.log")),
            process=tune,
        )
        tune.send_signal(signum)
        tune.wait(timeout=120)  # the server stops within its grace, then tune exits
        server_left = server is not None and is_running(server)
    finally:
        for pid in (tune.pid, server):
            if pid is not None and is_running(pid):
                os.kill(pid, signal.SIGKILL)  # whatever the test found, nothing outlives it
        tune.wait(timeout=30)
    text = output.read_text()
    assert server is not None and not server_left, text
    assert tune.returncode == 128 + signum, text
    assert "Traceback" not in text, text
    assert text.splitlines()[-1] == f"ferry bench tune: stopped ({signum.name})", text
