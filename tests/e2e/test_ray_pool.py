"""``ferry serve --ray`` with models loaded on demand: one pool deployment multiplexes them
(Ray Serve's model multiplexing) over its replicas. A replica holding at most two models
answers three in turn; Ray unloads the least recently used one and the replica evicts it
from its Ferry service (asked again, it comes back as a fresh load); describe says where a
model lives; scaling one pooled model is refused with the way to scale the pool.

Beside them, a model of its own deployment whose replica runs the handler in its own
process (``ray_handler_in_replica``): it answers from the replica's process, and a crash
in its handler takes the replica down, Ray answering 500, until Ray has started another."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferry.ray_serve.plan import HANDLER_IN_REPLICA_ENVIRONMENT
from tests.fixtures.haproxy import free_port
from tests.fixtures.models import digest_archive
from tests.fixtures.polling import HANG_GUARD, wait_until
from tests.fixtures.server import RunningServer, ferry_server

pytestmark = pytest.mark.e2e
if importlib.util.find_spec("ray") is None:  # a lean install: only then is this skipped
    pytest.skip("Ray is not installed: pip install 'ferry-serve[ray]'", allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    cluster_utils: Any = importlib.import_module("ray.cluster_utils")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        cluster.wait_for_nodes(timeout=HANG_GUARD)
        tmp = tmp_path_factory.mktemp("ray-pool")
        store = tmp / "store"
        store.mkdir()
        models = [digest_archive(store, name, loadOnDemand=True) for name in ("a", "b", "c")]
        models.append(digest_archive(store, "own"))
        with ferry_server(
            store,
            models,
            tmp,
            "--inference-address",
            f"http://127.0.0.1:{free_port('127.0.0.1')}",
            "--management-address",
            f"http://127.0.0.1:{free_port('127.0.0.1')}",
            "--ray-models-per-replica",
            "2",
            "--ray-handler-in-replica",
            "true",
            "--ray",
            cluster.address,
            command=[sys.executable, "-m", "ferry"],
        ) as running:
            yield running
    finally:
        cluster.shutdown()


def predict(server: RunningServer, model: str, body: bytes = b"x") -> dict[str, Any]:
    response = httpx.post(f"{server.url}/predictions/{model}", content=body, timeout=HANG_GUARD)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["digest"] == hashlib.sha256(body).hexdigest()
    return answer


def test_a_replica_of_two_models_serves_three_evicting_the_least_recently_used(
    server: RunningServer,
) -> None:
    assert [predict(server, "a")["sequence"] for _ in range(2)] == [1, 2]
    predict(server, "b")
    predict(server, "c")  # a third model: Ray unloads a, the replica evicts it
    assert predict(server, "a")["sequence"] == 1  # loaded afresh
    missing = httpx.post(f"{server.url}/predictions/nothing", content=b"x", timeout=HANG_GUARD)
    assert missing.status_code == 404


def test_describe_names_the_pool_and_scaling_a_pooled_model_is_refused(
    server: RunningServer,
) -> None:
    with server.management() as api:
        (described,) = api.get("/models/b").json()
        assert described["loadOnDemand"] is True
        assert described["ray"]["deployment"] == "ferry_model_pool"
        assert described["ray"]["multiplexed"] is True
        assert described["ray"]["modelsPerReplica"] == 2
        listed = {m["modelName"] for m in api.get("/models").json()["models"]}
        assert listed == {"a", "b", "c", "own"}
        refused = api.put("/models/b", params={"min_worker": 2})
        assert refused.status_code == 400
        assert "ray_pool_replicas" in refused.json()["message"]


def test_a_handler_in_its_replica_answers_from_the_replicas_process(
    server: RunningServer,
) -> None:
    pid = predict(server, "own")["pid"]
    command = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"ServeReplica:ferry_own_v1_0" in command, command  # Ray's replica, no worker
    # It runs with Ferry's Ray settings for a handler in the replica (its code on a loop thread).
    environment = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
    settings = {f"{key}={value}".encode() for key, value in HANDLER_IN_REPLICA_ENVIRONMENT.items()}
    assert settings <= environment, settings - environment
    crashed = httpx.post(f"{server.url}/predictions/own", content=b"crash", timeout=HANG_GUARD)
    assert crashed.status_code == 500  # Ray's proxy: the replica's process ended

    def answered_again() -> bool:
        response = httpx.post(f"{server.url}/predictions/own", content=b"x", timeout=HANG_GUARD)
        return response.status_code == 200 and response.json()["pid"] != pid

    wait_until("a fresh replica to answer", answered_again)
