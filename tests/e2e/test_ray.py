"""``ferry serve --ray`` on a local multi-node Ray cluster (``ray.cluster_utils.Cluster``:
a head and two more nodes, each its own raylet with one logical CPU, on this machine).

A model of two replicas (one CPU each) is spread over two nodes and answers right under
concurrent load, on TorchServe's prediction path straight from Ray's proxy and on its
explanations path through Ferry's router; with tracing on, the replicas trace both
paths' requests under the client's traceparent (OpenTelemetry's variables reach them
through the deployment); the management API's scale call changes the replica count; a
node holding a replica is removed under load on both paths, every
request is answered, and the replica comes back on the node left free.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ferry.config.settings import ServerSettings
from tests.fixtures.background_load import BackgroundLoad
from tests.fixtures.haproxy import free_port
from tests.fixtures.models import digest_archive
from tests.fixtures.otlp_receiver import Receiver
from tests.fixtures.polling import HANG_GUARD, wait_until
from tests.fixtures.server import RunningServer, ferry_server

pytestmark = pytest.mark.e2e
if importlib.util.find_spec("ray") is None:  # a lean install: only then is this skipped
    pytest.skip("Ray is not installed: pip install 'ferry-serve[ray]'", allow_module_level=True)
NODE_HEADER = "x-ferry-ray-node"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Ray is installed (``make test`` installs the ``ray`` extra): a Ray that cannot be
    imported or cannot start a cluster fails these tests with its error; it never skips
    them. Every wait is bounded: Ray's for each node to start (30 s, then it raises), ours
    for the three to join."""
    cluster_utils: Any = importlib.import_module("ray.cluster_utils")
    # No usage report from a test cluster (this machine reaches no such service anyway).
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    running = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for _ in range(2):
            running.add_node(num_cpus=1)
        running.wait_for_nodes(timeout=HANG_GUARD)
        yield running
    finally:
        running.shutdown()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture(scope="module")
def server(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("ray")
    store = tmp / "store"
    store.mkdir()
    digest_archive(store, "digest", minWorkers=2, batchSize=4, maxBatchDelay=10)
    # Traced: the cluster's nodes started before these variables were set, so only the
    # server's deployment can give them to the replicas.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        patch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        yield from _server(cluster, store, tmp)


def _server(cluster: Any, store: Any, tmp: Any) -> Iterator[RunningServer]:
    with ferry_server(
        store,
        ["digest.mar"],
        tmp,
        "--inference-address",
        f"http://127.0.0.1:{free_port('127.0.0.1')}",
        "--management-address",
        f"http://127.0.0.1:{free_port('127.0.0.1')}",
        "--ray",
        cluster.address,
        "--enable-tracing",
        "true",
        command=[sys.executable, "-m", "ferry"],
    ) as running:
        yield running


def _predict(client: httpx.Client, url: str, body: bytes) -> tuple[int, str]:
    response = client.post(f"{url}/predictions/digest", content=body)
    if response.status_code == 200:
        assert response.json()["digest"] == hashlib.sha256(body).hexdigest()
    return response.status_code, response.headers.get(NODE_HEADER, "")


def _replicas(server: RunningServer) -> dict[str, int]:
    with server.management() as api:
        (described,) = api.get("/models/digest").json()
    replicas: dict[str, int] = described["ray"]["replicas"]
    return replicas


class Load(BackgroundLoad):
    """Clients POSTing through Ray's proxy: every digest checked (a wrong one is the
    outcome ``wrong-digest``), the nodes that answered counted, failures' bodies kept. On
    TorchServe's prediction path (straight to the model's replicas), or with ``routed``
    on its explanations path (through Ferry's router; the digest handler explains with
    the same digest)."""

    def __init__(self, url: str, clients: int = 4, routed: bool = False) -> None:
        self.nodes = Counter[str]()
        self.messages: list[str] = []
        path = "/explanations/digest" if routed else "/predictions/digest"
        super().__init__(f"{url}{path}", clients, self._note)

    def _note(self, body: bytes, response: httpx.Response) -> str | None:
        node = response.headers.get(NODE_HEADER)
        if node:
            self.nodes[node] += 1
        if response.status_code != 200:
            self.messages.append(response.text)
            return None
        if response.json()["digest"] != hashlib.sha256(body).hexdigest():
            return "wrong-digest"
        return None


def test_a_model_spread_over_two_nodes_answers_right_under_load(server: RunningServer) -> None:
    assert _replicas(server) == {"RUNNING": 2}
    with Load(server.url, clients=6) as direct, Load(server.url, clients=2, routed=True) as routed:
        wait_until("200 answers", lambda: direct.answered() >= 200 and routed.answered() >= 50)
    for load in (direct, routed):
        assert set(load.outcomes) == {"200"}, (load.outcomes, load.messages[:3])
        assert len(load.nodes) == 2  # one replica per node (each needs the node's one CPU)
    with httpx.Client() as client:
        # Ray's proxy sends TorchServe's path to the model's own application, the rest
        # to Ferry's router.
        routes = client.get(f"{server.url}/-/routes").json()
        assert routes == {"/predictions/digest": "ferry_digest_v1_0", "/": "ferry"}
        ping = client.get(f"{server.url}/ping")
        assert ping.json() == {"status": "Healthy"}
        missing = client.post(f"{server.url}/predictions/nope", content=b"x")
        assert missing.status_code == 404
        assert missing.json()["type"] == "ModelNotFoundException"


def test_sagemakers_invocations_reach_the_one_model_through_the_router(
    server: RunningServer,
) -> None:
    body = b"an invocation"
    octets = {"Content-Type": "application/octet-stream"}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        alone = client.post("/invocations", content=body, headers=octets)
        named = client.post("/invocations?model_name=digest", content=body, headers=octets)
        unknown = client.post("/invocations?model_name=nope", content=body, headers=octets)
    for answer in (alone, named):
        assert answer.status_code == 200, answer.text
        assert answer.json()["digest"] == hashlib.sha256(body).hexdigest()
    assert unknown.status_code == 404


def test_replicas_trace_requests_under_the_clients_traceparent_on_both_paths(
    server: RunningServer, receiver: Receiver
) -> None:
    trace_id = "6bf92f3577b34da6a3ce929d0e0e4736"
    parents = {
        "/predictions/digest": "00000000000000e1",
        "/explanations/digest": "00000000000000e2",
    }
    with httpx.Client(timeout=HANG_GUARD) as client:
        for path, parent in parents.items():
            headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
            answer = client.post(f"{server.url}{path}", content=b"traced", headers=headers)
            assert answer.status_code == 200, answer.text

    def traced_parents() -> set[str]:
        spans = receiver.named("predict digest")
        return {s.parent_span_id.hex() for s in spans if s.trace_id.hex() == trace_id}

    wait_until("both requests' spans", lambda: set(parents.values()) <= traced_parents())


def test_a_body_over_max_request_size_gets_413_on_both_paths(server: RunningServer) -> None:
    """Refused by the replica (direct) or the router before it is read whole or sent on:
    TorchServe's 413, never a worker's memory or Ray's object store."""
    too_large = b"x" * (ServerSettings.max_request_size + 1)
    with httpx.Client(timeout=HANG_GUARD) as client:
        for path in ("/predictions/digest", "/explanations/digest"):
            response = client.post(f"{server.url}{path}", content=too_large)
            assert response.status_code == 413, (path, response.text)
            assert response.json()["type"] == "RequestEntityTooLargeException"


def test_the_management_api_scales_replicas(server: RunningServer) -> None:
    with server.management() as api:
        scaled = api.put("/models/digest", params={"min_worker": 3, "synchronous": "true"})
        assert scaled.status_code == 200, scaled.text
        assert scaled.json() == {"status": "Workers scaled to 3 for model: digest"}
        assert _replicas(server) == {"RUNNING": 3}
        with httpx.Client(timeout=HANG_GUARD) as client:
            nodes = {_predict(client, server.url, b"%d" % i)[1] for i in range(60)}
        assert len(nodes) == 3
        back = api.put("/models/digest", params={"min_worker": 2, "synchronous": "true"})
        assert back.status_code == 200
        wait_until("2 replicas", lambda: _replicas(server) == {"RUNNING": 2})
        missing = api.put("/models/nope", params={"min_worker": 1})
        assert missing.status_code == 404
        bad = api.put("/models/digest", params={"min_worker": "many"})
        assert bad.status_code == 400


def test_a_node_removed_under_load_loses_no_request_silently(
    server: RunningServer, cluster: Any
) -> None:
    """Requests the lost replica held are answered: through Ferry's router, retried once on
    the other replica (or answered 503 naming the loss); straight from Ray's proxy (no
    router to retry them), with Ray's own 500. The replica comes back on the node left
    free."""
    with Load(server.url, clients=3) as load, Load(server.url, clients=2, routed=True) as routed:
        wait_until("answers from both replicas", lambda: len(load.nodes) == 2)
        serving = set(load.nodes)
        head = cluster.head_node.node_id
        (victim,) = [
            node
            for node in cluster.list_all_nodes()
            if node.node_id in serving and node.node_id != head
        ][:1]
        cluster.remove_node(victim)
        removed_at = load.answered()
        # Ray Serve notices the lost replica (its health check) and starts another on the
        # node left free: answers from a node that was not serving before.
        wait_until("the replacement replica to answer", lambda: bool(set(load.nodes) - serving))
        after = Counter(load.nodes)

        def answered_since() -> set[str]:
            return {node for node, count in load.nodes.items() if count > after.get(node, 0)}

        # Throughput recovered on two replicas: both answer new requests. (How soon Ray's
        # router sends the new replica its share depends on its queue-length probes.)
        wait_until("answers from two replicas again", lambda: len(answered_since()) == 2)
    answered_by = answered_since()
    assert victim.node_id not in answered_by
    assert _replicas(server) == {"RUNNING": 2}
    assert load.answered() > removed_at and routed.answered() > 0
    unexpected = set(routed.outcomes) - {"200", "503"}
    assert not unexpected, routed.outcomes
    for message in routed.messages:
        assert json.loads(message)["type"] == "ServiceUnavailableException", message
        assert "lost" in json.loads(message)["message"]
    assert not set(load.outcomes) - {"200", "500"}, load.outcomes
    assert all(message == "Internal Server Error" for message in load.messages), load.messages


def test_sigterm_removes_the_application_and_exits_0(server: RunningServer) -> None:
    """Last in this module: the cluster stays; only Ferry's application goes."""
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=HANG_GUARD) == 0
    assert "deleting the Ray Serve applications ['ferry_digest_v1_0', 'ferry']" in server.log()
    # Issue 51: the lines Ray relays from its workers carry no colour codes in Ferry's log.
    assert "\x1b[" not in server.log()
