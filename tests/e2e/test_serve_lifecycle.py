"""``ferry serve`` starting and stopping: ports in use, key files, signals at any moment.

Each test waits on something the server writes (a log line, the ready file, a file the
handler creates), never on a sleep; worker processes are found through /proc.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ferry.service.snapshots import latest_snapshot
from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.cli import FERRY, serve_args
from tests.fixtures.gate import busy_worker
from tests.fixtures.models import HANDLERS, echo_store, write_config
from tests.fixtures.polling import wait_until
from tests.fixtures.processes import descendants_of, is_running
from tests.fixtures.server import RunningServer, ferry_server

pytestmark = pytest.mark.e2e
KNOWN_KEYS = {"management": {"key": "known-management"}, "inference": {"key": "known-inference"}}


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return echo_store(tmp_path)


def _blocking_archive(store: Path) -> str:
    scratch = store / ".blocker-src"
    scratch.mkdir()
    spec = ArchiveSpec(
        model_name="blocker",
        handler=str(HANDLERS / "blocking_handler.py"),
        config_file=write_config(scratch, {"minWorkers": 1}),
    )
    return write_archive(spec, store, force=True).name


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _models_status(server: RunningServer, key: str) -> int:
    with server.management() as api:
        return api.get("/models", headers=_bearer(key)).status_code


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.mark.parametrize("busy", ["inference", "management"])
def test_a_port_in_use_stops_start_up_in_one_line_and_writes_no_keys(
    store: Path, tmp_path: Path, held_port: int, busy: str
) -> None:
    key_file = tmp_path / "key_file.json"
    if busy == "inference":  # a running server's key file: must survive byte for byte
        key_file.write_text(json.dumps(KNOWN_KEYS))
        key_file.chmod(0o600)
    before = key_file.read_bytes() if key_file.exists() else None
    url = f"http://127.0.0.1:{held_port}"
    argv = [
        *FERRY,
        *serve_args(store, "--models", "echo.mar", "--key-file", str(key_file), **{busy: url}),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    line = f"ferry serve: cannot listen on {url} ({busy}_address): address already in use"
    assert line in result.stderr.splitlines()
    assert "Traceback" not in result.stderr
    assert "echo" not in result.stderr  # no worker was started for the model
    assert (key_file.read_bytes() if key_file.exists() else None) == before


def test_a_restart_and_a_second_server_keep_the_keys(store: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key_file.json"
    with ferry_server(store, [], tmp_path, auth=True) as first:
        written = key_file.read_bytes()
        management_key = json.loads(written)["management"]["key"]
        with ferry_server(store, [], tmp_path, auth=True) as second:  # same key file
            assert key_file.read_bytes() == written
            assert _models_status(first, management_key) == 200
            assert _models_status(second, management_key) == 200
    with ferry_server(store, [], tmp_path, auth=True) as restarted:
        assert key_file.read_bytes() == written
        assert _models_status(restarted, management_key) == 200
        assert "token authorization on; keys from" in restarted.log()
        assert management_key not in restarted.log()


def test_the_management_key_can_come_from_the_environment(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FERRY_MANAGEMENT_KEY", "key-from-the-environment")
    with ferry_server(store, [], tmp_path, auth=True) as server:
        assert _models_status(server, "key-from-the-environment") == 200
        assert _models_status(server, "another-key") == 401
        assert "key-from-the-environment" not in server.log()


def test_sigint_while_a_model_loads_stops_the_server_and_its_worker(
    store: Path, tmp_path: Path
) -> None:
    archive = _blocking_archive(store)
    log_path, ready_file = tmp_path / "serve.log", tmp_path / "ready.json"
    argv = [
        *FERRY,
        *serve_args(
            store, "--models", archive, "--disable-token-auth", "--ready-file", str(ready_file)
        ),
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        marker = "blocking handler loading in pid "
        wait_until(
            "the model loading",
            lambda: marker in log_path.read_text(),
            process=process,
            log=log_path,
        )
        worker = int(log_path.read_text().split(marker, 1)[1].split()[0])
        assert worker in descendants_of(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log_text = log_path.read_text()
    assert "start-up interrupted" in log_text and "Traceback" not in log_text
    assert not is_running(worker)
    assert not ready_file.exists()


def test_an_interrupted_start_up_writes_no_model_snapshot(store: Path, tmp_path: Path) -> None:
    """The shutdown snapshot is a served state's: models half loaded are not the ones the
    next start should restore."""
    archive = _blocking_archive(store)
    logs = tmp_path / "logs"
    argv = [
        *FERRY,
        *serve_args(
            store, "--models", archive, "--disable-token-auth", "--log-location", str(logs)
        ),
    ]
    model_log = logs / "model_log.log"
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(
            "the model loading",
            lambda: (
                model_log.exists() and "blocking handler loading in pid" in model_log.read_text()
            ),
            process=process,
            log=logs / "ts_log.log",
        )
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "start-up interrupted" in (logs / "ts_log.log").read_text()
    assert latest_snapshot(logs / "config") is None  # neither a startup nor a shutdown one


def test_sigterm_while_serving_exits_0_and_stops_the_workers(store: Path, tmp_path: Path) -> None:
    with ferry_server(store, ["echo.mar"], tmp_path, command=FERRY) as server:
        workers = descendants_of(server.process.pid)
        assert workers
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
    assert not any(is_running(pid) for pid in workers)
    assert "shutting down" in server.log()


def test_a_second_signal_while_shutting_down_exits_at_once(store: Path, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    os.mkfifo(gate / "release")  # the handler blocks opening it: a request stays in flight
    with ferry_server(store, ["echo.mar"], tmp_path, command=FERRY) as server:
        workers = descendants_of(server.process.pid)
        in_flight = threading.Thread(
            target=_post_quietly, args=(server.url, b"block:%s" % bytes(gate))
        )
        in_flight.start()
        started = gate / "started"
        wait_until(
            "the request in flight", started.exists, process=server.process, log=server.log_path
        )
        server.process.send_signal(signal.SIGTERM)
        # Shutdown now waits for the request in flight: signal again while it does.
        wait_until(
            "shutdown",
            lambda: "shutting down" in server.log(),
            process=server.process,
            log=server.log_path,
        )
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=30) == 128 + signal.SIGINT
        in_flight.join(timeout=60)
    assert "SIGINT while stopping: exiting now" in server.log()
    assert not any(is_running(pid) for pid in workers)


def _post_quietly(url: str, body: bytes) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server exits while it is in flight
        httpx.post(f"{url}/predictions/echo", content=body, timeout=120)


def _refused(url: str) -> bool:
    """True once a new connection is not served: refused, or reset unanswered because the
    kernel queued it on the listening socket just before the server closed that socket."""
    try:
        httpx.get(f"{url}/ping", timeout=10)
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True
    return False


def test_sigterm_finishes_the_request_in_flight_then_exits(store: Path, tmp_path: Path) -> None:
    """No drain delay: after SIGTERM the listener stops accepting, yet the request a worker
    holds is still answered 200 (it is released only once new connections are refused),
    then the server exits 0."""
    with ferry_server(store, ["echo.mar"], tmp_path, command=FERRY) as server:
        with busy_worker(server, "echo", tmp_path / "gate") as statuses:
            server.process.send_signal(signal.SIGTERM)
            wait_until(
                "the listener to refuse connections",
                lambda: _refused(server.url),
                process=server.process,
            )
        assert statuses == [200]
        assert server.process.wait(timeout=90) == 0


def test_during_the_drain_delay_readiness_is_503_and_requests_are_still_served(
    store: Path, tmp_path: Path
) -> None:
    """``--drain-delay 20``: after SIGTERM, every readiness probe says no while predictions
    are still answered (each closing its connection); the server then exits 0."""
    args = ("--drain-delay", "20")
    with ferry_server(store, ["echo.mar"], tmp_path, *args, command=FERRY) as server:
        with server.client() as client:
            assert client.get("/ping").status_code == 200
            server.process.send_signal(signal.SIGTERM)
            wait_until(
                "readiness to turn 503",
                lambda: client.get("/ping").status_code == 503,
                process=server.process,
            )
            assert client.get("/ping").json() == {"status": "Draining"}
            model = client.get("/ping/echo")
            assert model.status_code == 503
            assert model.json()["reason"] == "the server is shutting down"
            assert client.get("/v2/health/ready").status_code == 503
            assert client.get("/v2/health/live").status_code == 200
            answer = client.post("/predictions/echo", content=b"still served")
            assert answer.status_code == 200
            assert answer.headers["connection"] == "close"
        assert server.process.wait(timeout=90) == 0
    assert "draining: readiness is 503 for 20.0 s" in server.log()
