"""``ferry serve --start`` / ``--stop``: TorchServe's background server with a pid file.

The ``--start`` parent returns once the server wrote its ready file; the tests read the
addresses from that file and find worker processes through /proc.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from ferry.cli.daemon import running_pid
from ferry.config.sources import read_properties
from ferry.service.snapshots import latest_snapshot
from tests.fixtures.cli import run_ferry, serve_args
from tests.fixtures.models import echo_store
from tests.fixtures.polling import wait_until
from tests.fixtures.processes import descendants_of, is_running

pytestmark = pytest.mark.e2e


@contextmanager
def _stopped_at_end(pid_file: Path) -> Iterator[None]:
    """Whatever the test did, the background server it started does not outlive it."""
    try:
        yield
    finally:
        pid = running_pid(pid_file)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            wait_until("the leftover server to stop", lambda: not is_running(pid))


def _start_args(tmp_path: Path, pid_file: Path, *extra: str, **addresses: str) -> list[str]:
    store = echo_store(tmp_path)
    ready = tmp_path / "ready.json"
    return serve_args(
        store,
        "--models",
        "echo.mar",
        "--ready-file",
        str(ready),
        "--pid-file",
        str(pid_file),
        "--key-file",
        str(tmp_path / "key_file.json"),
        "--start",
        *extra,
        **addresses,
    )


def test_start_serves_in_the_background_until_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # --start logs to ./logs by default
    pid_file = tmp_path / "run" / "ferry.pid"
    logs = tmp_path / "logs"
    args = _start_args(tmp_path, pid_file)
    with _stopped_at_end(pid_file):
        started = run_ferry(*args)
        assert started.returncode == 0, started.stderr
        pid = int(pid_file.read_text())
        assert started.stdout.strip() == f"Ferry started (pid {pid}); logs in {logs}"
        assert is_running(pid)
        workers = descendants_of(pid)
        assert workers

        urls = json.loads((tmp_path / "ready.json").read_text())
        answer = httpx.post(f"{urls['inference']}/predictions/echo", content=b"x", timeout=60)
        assert answer.status_code == 200
        access_log = logs / "access_log.log"
        wait_until(
            "the access log line",
            lambda: "path=/predictions/echo status=200" in access_log.read_text(),
        )
        ts_log = (logs / "ts_log.log").read_text()
        assert "inference API listening on" in ts_log and "model echo v1.0" in ts_log
        assert "ferry.access" not in ts_log and "ferry.worker.output" not in ts_log
        assert "ferry.worker.output" in (logs / "model_log.log").read_text()
        assert (logs / "model_metrics.log").exists()
        # TorchServe's system metrics, the first set logged before the server is ready.
        metrics = (logs / "ts_metrics.log").read_text().splitlines()
        host = f"|#Level:Host|#hostname:{socket.gethostname()},timestamp:"
        assert any(
            line.split(" - ", 1)[1].startswith("CPUUtilization.Percent:") for line in metrics
        )
        assert all(host in line or ",DeviceId:" in line for line in metrics)
        assert "Utilization.Percent" not in ts_log

        again = run_ferry(*args)
        assert again.returncode == 1
        assert f"Ferry is already running (pid {pid}" in again.stderr
        assert int(pid_file.read_text()) == pid

        stopped = run_ferry("serve", "--stop", "--pid-file", str(pid_file))
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith(f"Ferry stopped (pid {pid}, inference {urls['inference']}")
    assert not is_running(pid)
    wait_until("the workers to go", lambda: not any(is_running(w) for w in workers))
    assert not pid_file.exists()
    # Stopping wrote TorchServe's shutdown snapshot: the one the next start restores.
    shutdown = latest_snapshot(logs / "config")
    assert shutdown is not None and shutdown.name.endswith("-shutdown.cfg")
    assert read_properties(shutdown)["load_models"] == "echo=echo.mar"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_servers_are_told_apart_by_their_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47, item 8: one default pid file per user account, so ``--stop`` anywhere
    stopped whichever ``--start`` server ran. Now each server has its own, after its
    inference address; ``--stop`` stops the one its flags name and says which."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # this test's own pid folder
    monkeypatch.chdir(tmp_path)
    store = echo_store(tmp_path)
    folder = tmp_path / f"ferry-{os.getuid()}"
    ports = {"a": _free_port(), "b": _free_port()}
    inference = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    pid_files = {name: folder / f"ferry-127.0.0.1-{port}.pid" for name, port in ports.items()}
    with _stopped_at_end(pid_files["a"]), _stopped_at_end(pid_files["b"]):
        for name in ports:
            logs = str(tmp_path / f"logs-{name}")
            start = serve_args(
                store, "--disable-token-auth", "--log-location", logs, "--start",
                inference=inference[name],
            )  # fmt: skip
            started = run_ferry(*start)
            assert started.returncode == 0, started.stderr
        pids = {name: int(pid_file.read_text()) for name, pid_file in pid_files.items()}
        assert all(is_running(pid) for pid in pids.values())

        unnamed = run_ferry("serve", "--stop")  # two run, and nothing says which
        assert unnamed.returncode == 1, unnamed.stderr
        assert "Several Ferry servers are running; none stopped." in unnamed.stderr
        for name, pid in pids.items():
            assert f"pid {pid}, inference {inference[name]}, management http" in unnamed.stderr
            assert is_running(pid)

        named = run_ferry("serve", "--stop", "--inference-address", inference["b"])
        assert named.returncode == 0, named.stderr
        assert named.stdout.startswith(
            f"Ferry stopped (pid {pids['b']}, inference {inference['b']}"
        )
        assert not is_running(pids["b"]) and is_running(pids["a"])
        assert not pid_files["b"].exists()

        again = run_ferry("serve", "--stop", "--inference-address", inference["b"])
        assert again.returncode == 0
        assert again.stdout == f"Ferry is not currently running at {inference['b']}.\n"
        assert f"pid {pids['a']}, inference {inference['a']}" in again.stderr
        assert is_running(pids["a"])

        only = run_ferry("serve", "--stop")  # the only one left: stopped, and named
        assert only.returncode == 0, only.stderr
        assert only.stdout.startswith(f"Ferry stopped (pid {pids['a']}, inference {inference['a']}")
        assert not is_running(pids["a"])
    assert not list(folder.iterdir())


def test_stop_with_nothing_running_says_so_and_succeeds(tmp_path: Path) -> None:
    """As ``torchserve --stop``: a line on stdout, exit 0 (stopping is idempotent)."""
    pid_file = tmp_path / "ferry.pid"
    result = run_ferry("serve", "--stop", "--pid-file", str(pid_file))
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        "Ferry is not currently running.\n",
        "",
    )
    pid_file.write_text("999999999\n")  # a stale file: no such process
    result = run_ferry("serve", "--stop", "--pid-file", str(pid_file))
    assert result.returncode == 0 and result.stdout == "Ferry is not currently running.\n"
    assert not pid_file.exists()


def test_a_failed_start_prints_the_log_tail_and_the_servers_exit_code(tmp_path: Path) -> None:
    pid_file = tmp_path / "ferry.pid"
    with socket.socket() as held, _stopped_at_end(pid_file):
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = f"http://127.0.0.1:{held.getsockname()[1]}"
        logs = str(tmp_path / "logs")
        result = run_ferry(*_start_args(tmp_path, pid_file, "--log-location", logs, inference=busy))
    assert result.returncode == 2
    assert "Ferry exited during start-up (2):" in result.stderr
    assert f"cannot listen on {busy}" in result.stderr
    assert not pid_file.exists()
