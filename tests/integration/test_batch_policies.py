"""Batch policies and deadlines on a real server: the policy in describe and its switch
through the management API under load, a request shed at its deadline while a worker is
busy, the reasons batches left, and bad deadline headers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ferry_bench.load import LoadResult
from tests.fixtures.gate import busy_worker
from tests.fixtures.load import closed_loop
from tests.fixtures.models import digest_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("policies")
    store = tmp / "store"
    store.mkdir()
    digest_archive(store, "echo", batchSize=4, maxBatchDelay=20)
    digest_archive(store, "gated", batchSize=1, batchPolicy="fixed_window")
    digest_archive(store, "timed", clientTimeoutInMills=150)
    digest_archive(store, "kept", batchSize=1, batchPolicy="fixed_window", deadlineAction="delay")
    archives = ["echo.mar", "gated.mar", "timed.mar", "kept.mar"]
    with ferry_server(store, archives, tmp) as running:
        yield running


def _policy(client: httpx.Client, model: str) -> dict[str, object]:
    (described,) = client.get(f"/models/{model}").json()
    policy = described["batchPolicy"]
    assert isinstance(policy, dict)
    return policy


def test_describe_shows_the_policy_from_model_config(server: RunningServer) -> None:
    with server.management() as client:
        assert _policy(client, "gated")["policy"] == "fixed_window"
        echo = _policy(client, "echo")
        assert echo["policy"] == "adaptive" and "learnedCostMs" in echo


def test_switching_policy_under_load_drops_no_request(server: RunningServer) -> None:
    results: list[LoadResult] = []
    load = threading.Thread(
        target=lambda: results.append(
            closed_loop(server, "echo", [b"x"], concurrency=8, requests=600)
        )
    )
    load.start()
    with server.management() as client:
        for policy in ("immediate", "fixed_window", "adaptive", "immediate"):
            response = client.put("/models/echo", params={"batch_policy": policy})
            assert response.status_code == 200, response.text
            assert _policy(client, "echo")["policy"] == policy
        bad = client.put("/models/echo", params={"batch_policy": "greedy"})
        assert_error(bad, 400, "BadRequestException")
    load.join(timeout=120)
    (result,) = results
    assert result.statuses == {200: 600}
    with server.management() as client:
        assert _policy(client, "echo")["policy"] == "immediate"
        client.put("/models/echo", params={"batch_policy": "adaptive"})
        learned = _policy(client, "echo")["learnedCostMs"]
    assert isinstance(learned, dict) and learned  # the adaptive policy saw the batches


def test_a_request_past_its_deadline_is_shed_while_the_worker_is_busy(
    server: RunningServer, tmp_path: Path
) -> None:
    with busy_worker(server, "gated", tmp_path / "gate") as held, server.client() as client:
        # The only worker is held: this request cannot start, and is answered at its
        # deadline, not when the worker frees up.
        shed = client.post(
            "/predictions/gated", content=b"late", headers={"x-ferry-deadline-ms": "200"}
        )
        assert_error(shed, 504, "DeadlineExceededException")
        assert "deadline passed while it was queued" in shed.json()["message"]
    assert held == [200]  # the request the worker held was answered
    with server.client() as client:
        ok = client.post(
            "/predictions/gated", content=b"in time", headers={"x-ferry-deadline-ms": "60000"}
        )
        assert ok.status_code == 200
        for bad in ("0", "-5", "soon", "inf"):
            refused = client.post(
                "/predictions/gated", content=b"x", headers={"x-ferry-deadline-ms": bad}
            )
            message = assert_error(refused, 400, "BadRequestException")
            assert "x-ferry-deadline-ms must be a positive number" in message
    metrics = server.metrics()
    assert 'ferry_requests_shed_total{model_name="gated",model_version="1.0"} 1' in metrics
    assert 'ferry_batch_dispatch_total{model_name="gated",model_version="1.0",reason="full"}' in (
        metrics
    )


def test_torchserves_client_timeout_is_every_requests_deadline(
    server: RunningServer, tmp_path: Path
) -> None:
    """TorchServe drops such a request without an answer; Ferry answers it."""
    with server.management() as client:
        (described,) = client.get("/models/timed").json()
        assert described["clientTimeoutInMills"] == 150
    with busy_worker(server, "timed", tmp_path / "gate"), server.client() as client:
        shed = client.post("/predictions/timed", content=b"late")
        assert_error(shed, 504, "DeadlineExceededException")


def test_with_deadline_action_delay_a_late_request_is_kept_behind_those_on_time(
    server: RunningServer, tmp_path: Path
) -> None:
    """Triton's timeout action DELAY: the request whose deadline passed while the only
    worker was busy is not answered 504; it runs after the request that came later
    without a deadline, and both are answered."""
    with server.management() as client:
        (described,) = client.get("/models/kept").json()
        assert described["deadlineAction"] == "delay"
    ran_as: dict[str, int] = {}

    def send(name: str, headers: dict[str, str]) -> None:
        response = httpx.post(
            f"{server.url}/predictions/kept", content=name.encode(), headers=headers, timeout=120
        )
        assert response.status_code == 200, response.text
        ran_as[name] = response.json()["sequence"]

    def delayed() -> bool:
        return _gauge(server.metrics(), "ferry_requests_delayed_total", "kept") == 1

    senders = []
    with busy_worker(server, "kept", tmp_path / "gate"):
        late = threading.Thread(target=send, args=("late", {"x-ferry-deadline-ms": "50"}))
        late.start()
        wait_until("the late request to be delayed", delayed)
        on_time = threading.Thread(target=send, args=("on time", {}))
        on_time.start()
        senders = [late, on_time]
        wait_until(
            "both requests queued",
            lambda: _gauge(server.metrics(), "ferry_queue_depth", "kept") == 2,
        )
    for sender in senders:
        sender.join(timeout=120)
    assert sorted(ran_as, key=ran_as.__getitem__) == ["on time", "late"]
    assert _gauge(server.metrics(), "ferry_requests_shed_total", "kept") == 0


def test_a_higher_priority_request_overtakes_queued_ones(
    server: RunningServer, tmp_path: Path
) -> None:
    """With the only worker busy, three requests queue: the one sent last with
    x-ferry-priority 5 runs first, then the others in their order of arrival. The order is
    the worker's (its batch sequence numbers), not that in which client threads wake."""
    ran_as: dict[str, int] = {}

    def send(name: str, priority: str | None) -> None:
        headers = {} if priority is None else {"x-ferry-priority": priority}
        response = httpx.post(
            f"{server.url}/predictions/gated", content=name.encode(), headers=headers, timeout=120
        )
        assert response.status_code == 200, response.text
        ran_as[name] = response.json()["sequence"]

    def queued(count: int) -> Callable[[], bool]:
        return lambda: _gauge(server.metrics(), "ferry_queue_depth", "gated") == count

    senders = []
    with busy_worker(server, "gated", tmp_path / "gate"):
        for name, priority in (("first", None), ("second", "0"), ("urgent", "5")):
            sender = threading.Thread(target=send, args=(name, priority))
            sender.start()
            senders.append(sender)
            # each request queued before the next is sent
            wait_until(f"{len(senders)} requests queued", queued(len(senders)))
    for sender in senders:
        sender.join(timeout=120)
    assert sorted(ran_as, key=ran_as.__getitem__) == ["urgent", "first", "second"]


def test_bad_priorities_are_refused(server: RunningServer) -> None:
    with server.client() as client:
        for bad in ("high", "101", "-101", "1.5", ""):
            refused = client.post(
                "/predictions/echo", content=b"x", headers={"x-ferry-priority": bad}
            )
            message = assert_error(refused, 400, "BadRequestException")
            assert "x-ferry-priority must be an integer from -100 to 100" in message
        ok = client.post("/predictions/echo", content=b"x", headers={"x-ferry-priority": "-100"})
        assert ok.status_code == 200


def _gauge(metrics: str, name: str, model: str) -> float:
    """The sample's value; 0 while it is absent (a counter appears when first counted)."""
    prefix = f'{name}{{model_name="{model}",model_version="1.0"}} '
    lines = [line for line in metrics.splitlines() if line.startswith(prefix)]
    assert len(lines) <= 1
    return float(lines[0].removeprefix(prefix)) if lines else 0.0
