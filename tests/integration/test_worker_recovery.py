"""Dead and hung workers are replaced; every request they held gets an answer."""

from __future__ import annotations

import json
import os
import signal

from tests.fixtures.load import closed_loop
from tests.fixtures.server import RunningServer, worker_pid


def test_sigkilled_worker_under_load_is_replaced(main_server: RunningServer) -> None:
    victim = worker_pid(main_server, "victim")
    killed: list[int] = []

    def kill_midway(index: int, status: int, body: bytes) -> None:
        if index >= 50 and not killed:
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    payloads = [f"load-{i}".encode() for i in range(300)]
    result = closed_loop(main_server, "victim", payloads, concurrency=8, on_response=kill_midway)
    assert killed == [victim]
    assert sum(result.statuses.values()) == 300, "every request must get an answer"
    assert set(result.statuses) <= {200, 500}
    for _, status, body in result.bodies:
        if status == 500:
            assert json.loads(body)["type"] == "InternalServerException"
    # The replacement serves later requests.
    with main_server.client() as client:
        for i in range(20):
            response = client.post("/predictions/victim", content=f"after-{i}".encode())
            assert response.status_code == 200
            assert response.json()["pid"] != victim
        assert client.get("/ping").json() == {"status": "Healthy"}


def test_a_lone_request_that_kills_its_worker_gets_500_and_server_recovers(
    main_server: RunningServer,
) -> None:
    with main_server.client() as client:
        before = worker_pid(main_server, "victim")
        response = client.post("/predictions/victim", content=b"crash")
        assert response.status_code == 500
        body = response.json()
        assert body["code"] == 500 and body["type"] == "InternalServerException"
        assert "died" in body["message"]
        after = client.post("/predictions/victim", content=b"fine")
        assert after.status_code == 200 and after.json()["pid"] != before


def test_hung_worker_times_out_with_504_and_is_replaced(strict_server: RunningServer) -> None:
    with strict_server.client() as client:
        before = worker_pid(strict_server, "slow")
        response = client.post("/predictions/slow", content=b"hang")
        assert response.status_code == 504
        assert response.json()["type"] == "ResponseTimeoutException"
        after = client.post("/predictions/slow", content=b"fine")
        assert after.status_code == 200 and after.json()["pid"] != before


def test_worker_killed_while_idle_is_replaced_before_the_next_request(
    main_server: RunningServer,
) -> None:
    before = worker_pid(main_server, "victim")
    os.kill(before, signal.SIGKILL)
    with main_server.client() as client:
        response = client.post("/predictions/victim", content=b"next")
        assert response.status_code == 200
        assert response.json()["pid"] != before
