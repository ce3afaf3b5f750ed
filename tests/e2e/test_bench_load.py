"""``ferry bench load`` as a user runs it, against a real server."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.cli import run_ferry
from tests.fixtures.models import HANDLERS, digest_archive, write_config
from tests.fixtures.server import ferry_server

pytestmark = pytest.mark.e2e


def test_closed_and_open_loop_write_their_figures(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "echo", batchSize=8, maxBatchDelay=5)
    inputs = [tmp_path / "a.bin", tmp_path / "b.bin"]
    for index, path in enumerate(inputs):
        path.write_bytes(f"payload {index}".encode())
    with ferry_server(store, ["echo.mar"], tmp_path) as server:
        url = f"{server.url}/predictions/echo"
        common = [
            "--input",
            ",".join(map(str, inputs)),
            "--metrics-url",
            f"{server.metrics_url}/metrics",
        ]
        for mode, stop, out in (
            (["--concurrency", "8"], ["--requests", "400"], tmp_path / "closed"),
            (["--rate", "200"], ["--duration", "1"], tmp_path / "open"),
        ):
            run = run_ferry("bench", "load", url, *common, *mode, *stop, "--out", str(out))
            assert run.returncode == 0, run.stderr
            assert "goodput" in run.stdout
            figures = json.loads((out / "load.json").read_text())
            assert figures["goodput"] > 0 and figures["p99_ms"] >= figures["p50_ms"] > 0
            assert figures["errors"] == {} and figures["responses"] == figures["requests_sent"]
            assert figures["server"]["batches"] >= 1
        closed = json.loads((tmp_path / "closed" / "load.json").read_text())
        assert closed["mode"] == "closed" and closed["responses"] == 400
        opened = json.loads((tmp_path / "open" / "load.json").read_text())
        assert opened["mode"] == "open" and 100 <= opened["requests_sent"] <= 320


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    missing = run_ferry(
        "bench",
        "load",
        "http://127.0.0.1:9/predictions/x",
        "--input",
        str(tmp_path / "absent"),
        "--concurrency",
        "1",
        "--requests",
        "1",
        timeout=60,
    )
    assert missing.returncode == 2 and "absent" in missing.stderr
    both = run_ferry(
        "bench",
        "load",
        "http://x/predictions/x",
        "--input",
        "f",
        "--concurrency",
        "1",
        "--rate",
        "2",
        "--requests",
        "1",
        timeout=60,
    )
    assert both.returncode == 2 and "not allowed with" in both.stderr


def _load(url: str, inputs: list[Path], out: Path, *extra: str) -> tuple[int, str, Any]:
    run = run_ferry(
        "bench",
        "load",
        url,
        "--input",
        ",".join(map(str, inputs)),
        "--concurrency",
        "4",
        "--requests",
        "40",
        "--out",
        str(out),
        *extra,
        timeout=120,
    )
    figures = json.loads((out / "load.json").read_text()) if (out / "load.json").exists() else {}
    return run.returncode, run.stderr, figures


def test_errors_are_not_throughput_and_fail_the_command(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "echo")
    payload = tmp_path / "p.bin"
    payload.write_bytes(b"x")
    with ferry_server(store, ["echo.mar"], tmp_path) as server:
        code, stderr, figures = _load(f"{server.url}/predictions/absent", [payload], tmp_path / "a")
        assert code == 1 and "100.00% of requests failed" in stderr
        assert figures["goodput"] == 0 and figures["p50_ms"] is None
        assert figures["errors"] == {"404": 40} and figures["error_rate"] == 1.0
        tolerated = _load(
            f"{server.url}/predictions/absent", [payload], tmp_path / "b", "--max-error-rate", "1"
        )
        assert tolerated[0] == 0
        missing_metrics = _load(
            f"{server.url}/predictions/echo",
            [payload],
            tmp_path / "c",
            "--metrics-url",
            f"{server.url}/no-metrics-here",
        )
        assert missing_metrics[0] == 0
        assert missing_metrics[2]["server"].startswith("not measured: no Ferry metrics at")


def test_an_unreachable_target_is_named(tmp_path: Path) -> None:
    payload = tmp_path / "p.bin"
    payload.write_bytes(b"x")
    with socket.socket() as unused:  # bound, never listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        for url in (
            f"http://127.0.0.1:{port}/predictions/m",
            f"grpc://127.0.0.1:{port}/predictions/m",
        ):
            code, stderr, _ = _load(url, [payload], tmp_path / "out")
            assert code == 1, stderr
            assert f"cannot reach 127.0.0.1:{port}" in stderr and "Traceback" not in stderr


def _v2_archive(store: Path) -> None:
    """The V2-aware test handler (each input doubled), batch 8."""
    scratch = store.parent / "v2-src"
    scratch.mkdir()
    spec = ArchiveSpec(
        model_name="tensors",
        handler=str(HANDLERS / "v2_tensor_handler.py"),
        config_file=write_config(scratch, {"batchSize": 8, "maxBatchDelay": 20}),
    )
    write_archive(spec, store)


def test_grpc_targets_torchserve_predictions_and_open_inference(tmp_path: Path) -> None:
    pytest.importorskip("grpc")
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "echo", batchSize=8, maxBatchDelay=5)
    _v2_archive(store)
    raw = tmp_path / "raw.bin"
    raw.write_bytes(b"payload")
    document = tmp_path / "request.json"
    tensor = {"name": "x", "shape": [2], "datatype": "FP32", "data": [1.5, 2]}
    document.write_text(json.dumps({"inputs": [tensor]}))
    with ferry_server(store, ["echo.mar", "tensors.mar"], tmp_path) as server:
        assert server.grpc_url, "the gRPC inference API is on whenever grpcio is installed"
        metrics = ["--metrics-url", f"{server.metrics_url}/metrics"]
        predictions = _load(f"{server.grpc_url}/predictions/echo", [raw], tmp_path / "ts", *metrics)
        infer = _load(
            f"{server.grpc_url}/v2/models/tensors/infer", [document], tmp_path / "v2", *metrics
        )
        for code, stderr, figures in (predictions, infer):
            assert code == 0, stderr
            assert figures["succeeded"] == 40 and figures["grpc_codes"] == {"OK": 40}
            assert figures["goodput"] > 0 and figures["errors"] == {}
            assert figures["server"]["batches"] >= 1
        unknown = _load(f"{server.grpc_url}/v2/models/absent/infer", [document], tmp_path / "x")
        assert unknown[0] == 1
        assert unknown[2]["grpc_codes"] == {"NOT_FOUND": 40} and unknown[2]["errors"] == {"404": 40}


def test_a_rate_sweep_reports_and_plots_each_rate(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "echo", batchSize=4, maxBatchDelay=2)
    payload = tmp_path / "p.bin"
    payload.write_bytes(b"x")
    with ferry_server(store, ["echo.mar"], tmp_path) as server:
        run = run_ferry(
            "bench",
            "load",
            f"{server.url}/predictions/echo",
            "--input",
            str(payload),
            "--rate",
            "40,80",
            "--duration",
            "0.5",
            "--out",
            "out",  # relative to the working directory
            timeout=120,
            cwd=tmp_path,
        )
    assert run.returncode == 0, run.stderr
    figures = json.loads((tmp_path / "out" / "load.json").read_text())
    assert [item["rate"] for item in figures["rates"]] == [40.0, 80.0]
    assert all(item["traffic"].startswith("Poisson") for item in figures["rates"])
    assert "| offered (req/s) | goodput (req/s) |" in run.stdout
    assert (tmp_path / "out" / "load.png").read_bytes()[:4] == b"\x89PNG"
