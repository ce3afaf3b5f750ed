"""``ferry bench load`` as a user runs it, against a real server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.cli import run_ferry
from tests.fixtures.models import digest_archive
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
            assert "throughput" in run.stdout
            figures = json.loads((out / "load.json").read_text())
            assert figures["throughput"] > 0 and figures["p99_ms"] >= figures["p50_ms"] > 0
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
