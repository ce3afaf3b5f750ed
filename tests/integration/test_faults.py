"""Faults under load, re-run from issue 10's reproductions (loopback only, bounded): poison
and hanging requests fail alone, a worker that stops reading cannot hold a request past
responseTimeout, and non-finite parameters are refused."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cli import FERRY
from tests.fixtures.gate import busy_worker
from tests.fixtures.load import closed_loop
from tests.fixtures.models import DEMO_STORE, digest_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.processes import is_running
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server, worker_pid


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("faults")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"poisoned={digest_archive(store, 'poisoned', batchSize=8, maxBatchDelay=20)}",
        "hanging="
        + digest_archive(store, "hanging", batchSize=8, maxBatchDelay=20, responseTimeout=2),
        f"stopped={digest_archive(store, 'stopped', batchSize=1, responseTimeout=2)}",
        f"gated={digest_archive(store, 'gated', batchSize=1)}",
        f"faulting={digest_archive(store, 'faulting', batchSize=8, maxBatchDelay=20)}",
    ]
    with ferry_server(store, models, tmp, "--enable-model-api") as running:
        yield running


def describe(server: RunningServer, model: str) -> dict[str, Any]:
    with server.management() as api:
        document: dict[str, Any] = api.get(f"/models/{model}").json()[0]
        return document


def test_poison_requests_fail_alone_under_load(server: RunningServer) -> None:
    """2% of requests make their worker exit (issue 10: 36 innocent 500s before)."""
    payloads = [b"crash" if i % 50 == 25 else f"fine-{i}".encode() for i in range(200)]
    result = closed_loop(server, "poisoned", payloads, concurrency=16)
    statuses = {index: status for index, status, _ in result.bodies}
    assert len(statuses) == 200, "every request must get an answer"
    poisoned = {i for i, payload in enumerate(payloads) if payload == b"crash"}
    assert {i for i, status in statuses.items() if status != 200} == poisoned
    assert all(statuses[i] == 500 for i in poisoned)
    # Each poison costs its batch's worker and, retried alone if it had batch-mates, one more.
    assert describe(server, "poisoned")["workers"][0]["restarts"] <= 2 * len(poisoned)


def test_gpu_faults_fail_alone_and_their_workers_are_replaced(server: RunningServer) -> None:
    """A sticky CUDA error (device-side assert) poisons the worker's context: it is
    replaced, and only the requests that faulted fail, however they were batched."""
    first = worker_pid(server, "faulting")
    payloads = [b"gpu-fault" if i % 50 == 25 else f"fine-{i}".encode() for i in range(100)]
    result = closed_loop(server, "faulting", payloads, concurrency=16)
    statuses = {index: status for index, status, _ in result.bodies}
    assert len(statuses) == 100, "every request must get an answer"
    faulted = {i for i, payload in enumerate(payloads) if payload == b"gpu-fault"}
    assert {i for i, status in statuses.items() if status != 200} == faulted
    for index, status, body in result.bodies:
        if index in faulted:
            assert status == 500 and "GPU" in body.decode(), body
    assert worker_pid(server, "faulting") != first
    assert describe(server, "faulting")["workers"][0]["restarts"] >= len(faulted)


def test_a_hanging_request_fails_alone(server: RunningServer) -> None:
    payloads = [b"hang" if i == 10 else f"fine-{i}".encode() for i in range(40)]
    result = closed_loop(server, "hanging", payloads, concurrency=8)
    statuses = {index: status for index, status, _ in result.bodies}
    assert len(statuses) == 40
    assert statuses.pop(10) == 504
    assert set(statuses.values()) == {200}


def test_a_worker_that_stops_reading_cannot_hold_a_request(server: RunningServer) -> None:
    """A SIGSTOPped worker and a body bigger than the socket buffer: the send is bounded by
    responseTimeout too (before: no answer in 20 s, worker never replaced)."""
    stopped = worker_pid(server, "stopped")
    os.kill(stopped, signal.SIGSTOP)
    try:
        with server.client() as client:
            response = client.post("/predictions/stopped", content=b"x" * 900_000)
        # The batch never reached the stuck worker: it is retried on its replacement.
        assert response.status_code == 200, response.text
        assert response.json()["pid"] != stopped
    finally:
        with contextlib.suppress(ProcessLookupError):  # it was killed, as it should be
            os.kill(stopped, signal.SIGCONT)
    wait_until(
        "the stopped worker to be gone",
        lambda: not is_running(stopped),
        process=server.process,
        log=server.log_path,
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_registration_parameters_are_refused(server: RunningServer, value: str) -> None:
    with server.management() as api:
        response = api.post(
            "/models",
            params={"url": "poisoned.mar", "model_name": "nan", "response_timeout": value},
        )
        message = assert_error(response, 400, "BadRequestException")
        assert "response_timeout" in message


def test_the_server_recovers_from_the_faults(server: RunningServer) -> None:
    with server.client() as client:
        wait_until(
            "every worker back",
            lambda: client.get("/ping").json() == {"status": "Healthy"},
            process=server.process,
            log=server.log_path,
        )
        for model in ("poisoned", "hanging", "stopped", "gated"):
            assert client.post(f"/predictions/{model}", content=b"after").status_code == 200


def test_requests_whose_client_hung_up_never_reach_a_worker(
    server: RunningServer, tmp_path: Path
) -> None:
    """50 abandoned requests used to run anyway, delaying the next one by 5 s."""
    with busy_worker(server, "gated", tmp_path / "gate"):
        host, port = server.url.removeprefix("http://").split(":")
        for index in range(5):
            body = f"abandoned-{index}".encode()
            with socket.create_connection((host, int(port)), timeout=30) as client:
                client.sendall(
                    b"POST /predictions/gated HTTP/1.1\r\nHost: x\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
            # closed before any answer: the client hung up
        wait_until(
            "the hang-ups to be noticed",
            lambda: server.log().count("status=499 model=gated") >= 5,
            process=server.process,
            log=server.log_path,
        )
    with server.client() as client:
        assert client.post("/predictions/gated", content=b"after").status_code == 200
    assert 'ferry_requests_abandoned_total{model_name="gated",model_version="1.0"} 5' in (
        server.metrics()
    )
    assert server.log().count("status=499 model=gated") == 5


def test_a_handler_module_in_the_working_directory_cannot_hijack_a_built_in(
    tmp_path: Path,
) -> None:
    """Workers start with ``python -P``: the directory Ferry was started from is not on
    their import path (before, an image_classifier.py there replaced the built-in)."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    marker = tmp_path / "hijacked"
    (workdir / "image_classifier.py").write_text(
        f"open({str(marker)!r}, 'w').write('hijacked')\n"
        "def handle(data, context):\n    return ['hijacked'] * len(data or [])\n"
    )
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(DEMO_STORE / "shapes.mar", store / "shapes.mar")
    sample = (DEMO_STORE.parent / "samples" / "star.png").read_bytes()
    models = ["shapes=shapes.mar"]
    with (
        ferry_server(store, models, tmp_path, command=FERRY, cwd=workdir) as server,
        server.client() as client,
    ):
        answer = client.post("/predictions/shapes", content=sample)
    assert answer.status_code == 200 and "star" in answer.json()
    assert not marker.exists()
