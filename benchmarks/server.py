"""``ferry serve`` on free loopback ports for a benchmark run, stopped afterwards.

The benchmarks' own copy: benchmarks do not import the test suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT = 300.0


@dataclass(frozen=True)
class BenchmarkServer:
    url: str
    """The inference API."""
    log_path: Path
    metrics_url: str = ""
    """The metrics API (Prometheus text at ``/metrics``)."""
    management_url: str = ""
    grpc_target: str = ""
    """``HOST:PORT`` of the gRPC inference API (empty without grpcio)."""
    pid: int = 0
    """The frontend's process id."""


@contextmanager
def ferry_server(
    store: Path,
    models: list[str],
    tmp: Path,
    *extra: str,
    environment: dict[str, str] | None = None,
) -> Iterator[BenchmarkServer]:
    """Serve ``models`` (``name=archive`` specs) from ``store``; ``extra`` are serve flags,
    ``environment`` variables added to this process's. Its ready file and log go to
    ``tmp``."""
    ready_file = tmp / f"ready-{time.monotonic_ns()}.json"
    log_path = ready_file.with_suffix(".log")
    loopback = "http://127.0.0.1:0"
    argv = [
        *(sys.executable, "-m", "ferry", "serve", "--model-store", str(store)),
        *(["--models", *models] if models else []),
        *("--inference-address", loopback, "--management-address", loopback),
        *("--metrics-address", loopback, "--ready-file", str(ready_file)),
        *("--grpc-inference-port", "0", "--grpc-management-port", "0"),
        "--disable-token-auth",
        *extra,
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(environment or {})},
        )
    try:
        _wait_ready(process, ready_file, log_path)
        urls = json.loads(ready_file.read_text())
        grpc_url = urls.get("grpc_inference", "")
        yield BenchmarkServer(
            urls["inference"],
            log_path,
            urls.get("metrics", ""),
            urls.get("management", ""),
            grpc_url.removeprefix("grpc://"),
            process.pid,
        )
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(process: subprocess.Popen[bytes], ready_file: Path, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not ready_file.exists():
        if process.poll() is not None:
            raise RuntimeError(f"ferry serve exited with {process.returncode}: see {log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"ferry serve not ready in {START_TIMEOUT:g}s: see {log_path}")
        time.sleep(0.05)  # polling for the file the server writes once it listens
