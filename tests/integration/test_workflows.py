"""TorchServe's workflow API, end to end over HTTP: register a .war whose DAG fans out to
two models and back into a function, run requests through it, describe, list, unregister,
and every refusal with TorchServe's status and error type."""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferry_bench.load import run_closed_loop
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server
from tests.fixtures.workflows import PIPELINE_SPEC, pipeline_war, tensor_war, unchecked_war
from tests.integration.test_management import _QuietHandler as QuietHandler
from tests.integration.test_metrics import _value

BROKEN_DAG = PIPELINE_SPEC.replace(
    "  double: [aggregate]\n", "  double: [aggregate]\n  orphan: [aggregate]\n"
)
FAILING_NODE = PIPELINE_SPEC.replace(
    "  decuple: [aggregate]\n", "  decuple: [aggregate]\n  aggregate: [failing]\n"
)
UNLOADABLE = PIPELINE_SPEC.replace("url: decuple.mar", "url: missing.mar")
WINDOWED: dict[str, Any] = {"batchPolicy": "fixed_window", "maxBatchDelay": 120_000}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("workflows")
    store = tmp / "store"
    store.mkdir()
    pipeline_war(store)
    unchecked_war(store, "cyclic", BROKEN_DAG)
    pipeline_war(store, "failing", FAILING_NODE)
    pipeline_war(store, "unloadable", UNLOADABLE)
    # Full batches only (the window is far longer than any test): batching is certain.
    pipeline_war(store, "windowed", prefix="windowed-", **WINDOWED)
    tensor_war(store)
    with ferry_server(store, [], tmp, "--enable-model-api") as running:
        yield running


@pytest.fixture
def pipeline(server: RunningServer) -> Iterator[str]:
    with server.management() as api:
        response = api.post("/workflows", params={"url": "pipeline.war"})
        assert response.status_code == 200, response.text
        assert response.json() == {
            "status": "Workflow pipeline has been registered and scaled successfully."
        }
        yield "pipeline"
        assert api.delete("/workflows/pipeline").json() == {
            "status": 'Workflow "pipeline" unregistered'
        }


def test_a_request_runs_through_every_node(server: RunningServer, pipeline: str) -> None:
    with server.client() as client:
        response = client.post(f"/wfpredict/{pipeline}", content=b"[1, 2]")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    # pre_processing adds 1; the models multiply by 2 and 10; aggregate joins them.
    assert response.json() == {"double": [4.0, 6.0], "decuple": [20.0, 30.0]}


def test_tensors_pass_between_nodes_as_torchserve_passes_them(server: RunningServer) -> None:
    """TorchServe's densenet workflow pattern: a node answering a tensor sends it
    ``torch.save``d, and the next node ``torch.load``s it (JSON broke this)."""
    with server.management() as api:
        assert api.post("/workflows", params={"url": "tensors.war"}).status_code == 200
        try:
            with server.client() as client:
                response = client.post("/wfpredict/tensors", content=b"[1.5, 2.0]")
            assert response.status_code == 200, response.text
            assert response.json() == {"sum": 10.5, "values": [4.5, 6.0]}
        finally:
            assert api.delete("/workflows/tensors").status_code == 200


def test_concurrent_requests_are_batched_in_each_node(server: RunningServer) -> None:
    """24 requests from 8 clients through nodes that batch 4 and send only full batches:
    every answer right, and each model node ran exactly 6 batches of 4."""
    with server.management() as api:
        response = api.post("/workflows", params={"url": "windowed.war"})
        assert response.status_code == 200, response.text
    try:
        payloads = [json.dumps([i]).encode() for i in range(24)]
        url = f"{server.url}/wfpredict/windowed"
        result = asyncio.run(
            run_closed_loop(url, payloads, concurrency=8, requests=24, keep_bodies=True)
        )
        assert result.statuses == {200: 24}
        answers = {index: json.loads(body) for index, _, body in result.bodies}
        assert answers == {
            i: {"double": [2.0 * (i + 1)], "decuple": [10.0 * (i + 1)]} for i in range(24)
        }
        metrics = server.metrics()
        for node in ("windowed__double", "windowed__decuple"):
            assert _value(metrics, "ferry_batch_size_sum", model_name=node) == 24
            assert _value(metrics, "ferry_batch_size_count", model_name=node) == 6
    finally:
        with server.management() as api:
            api.delete("/workflows/windowed")


def test_describe_and_list(server: RunningServer, pipeline: str) -> None:
    with server.management() as api:
        described = api.get(f"/workflows/{pipeline}").json()
        listed = api.get("/workflows").json()
        models = [m["modelName"] for m in api.get("/models").json()["models"]]
        function_node = api.get("/models/pipeline__aggregate")
    assert described == [
        {
            "workflowName": "pipeline",
            "workflowUrl": "pipeline.war",
            "minWorkers": 1,
            "maxWorkers": 1,
            "batchSize": 4,
            "maxBatchDelay": 20,
            "workflowDag": "{pre_processing=[double, decuple], double=[aggregate], "
            "decuple=[aggregate]}",
        }
    ]
    assert listed == {"workflows": [{"workflowName": "pipeline", "workflowUrl": "pipeline.war"}]}
    assert models == ["pipeline__decuple", "pipeline__double"]  # function nodes not listed
    assert function_node.status_code == 200  # but described, as in TorchServe


def test_registering_twice_is_a_conflict(server: RunningServer, pipeline: str) -> None:
    with server.management() as api:
        again = api.post("/workflows", params={"url": "pipeline.war"})
    message = assert_error(again, 409, "ConflictStatusException")
    assert message == "Workflow pipeline is already registered."


def test_unknown_workflows_are_404(server: RunningServer) -> None:
    with server.management() as api, server.client() as client:
        for response in (
            api.get("/workflows/nope"),
            api.delete("/workflows/nope"),
            client.post("/wfpredict/nope", content=b"[1]"),
        ):
            assert assert_error(response, 404, "WorkflowNotFoundException") == (
                "Workflow not found: nope"
            )
        missing = api.post("/workflows", params={"url": "nope.war"})
        assert_error(missing, 404, "WorkflowNotFoundException")
        assert_error(api.post("/workflows"), 400, "BadRequestException")


def test_an_invalid_dag_is_refused(server: RunningServer) -> None:
    with server.management() as api:
        response = api.post("/workflows", params={"url": "cyclic.war"})
        assert "only one start node" in assert_error(response, 400, "InvalidDAGException")
        assert api.get("/workflows").json() == {"workflows": []}


def test_a_node_that_cannot_load_rolls_the_registration_back(server: RunningServer) -> None:
    with server.management() as api:
        response = api.post("/workflows", params={"url": "unloadable.war"})
        message = assert_error(response, 500, "WorkflowException")
        assert message.startswith("Workflow unloadable has failed to register. Failures: [")
        assert "unloadable__decuple" in message and "missing.mar" in message
        assert api.get("/models").json() == {"models": []}  # the nodes that loaded are gone


def test_a_node_failing_a_request_fails_it_with_500(server: RunningServer) -> None:
    with server.management() as api:
        assert api.post("/workflows", params={"url": "failing.war"}).status_code == 200
        try:
            with server.client() as client:
                response = client.post("/wfpredict/failing", content=b"[1]")
            message = assert_error(response, 500, "InternalServerException")
            assert "Error executing failing" in message
            assert "this node always fails" in message
        finally:
            api.delete("/workflows/failing")


def test_the_model_api_switch_guards_workflows_too(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    pipeline_war(store)
    with ferry_server(store, [], tmp_path) as server, server.management() as api:
        refused = api.post("/workflows", params={"url": "pipeline.war"})
        assert_error(refused, 405, "MethodNotAllowedException")


def test_a_war_from_an_allowed_url_is_downloaded_and_deleted_with_it(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    store = tmp_path / "store"
    store.mkdir()
    pipeline_war(store)  # its models stay in the store; the .war is served
    (store / "pipeline.war").rename(served / "pipeline.war")
    handler = functools.partial(QuietHandler, directory=str(served))
    allowed = ("--enable-model-api", "--allowed-urls", r"http://127\.0\.0\.1:\d+/.*")
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as archive_server:
        threading.Thread(target=archive_server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{archive_server.server_address[1]}/pipeline.war"
        try:
            with ferry_server(store, [], tmp_path, *allowed) as server, server.management() as api:
                for _ in range(2):  # registering the URL again works: nothing is left behind
                    response = api.post("/workflows", params={"url": url})
                    assert response.status_code == 200, response.text
                    assert (store / "pipeline.war").exists()
                    assert api.get("/workflows/pipeline").json()[0]["workflowUrl"] == url
                    assert api.delete("/workflows/pipeline").status_code == 200
                    assert not (store / "pipeline.war").exists()
        finally:
            archive_server.shutdown()


def test_a_war_past_max_unpacked_size_is_refused_as_a_mar_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A valid workflow carrying 3 MB of zeros (a few KiB on disk) against a 2 MB limit:
    the same 400 as the same bytes registered as a model, and nothing left unpacked."""
    store = tmp_path / "store"
    store.mkdir()
    war = store / pipeline_war(store, "padded")
    with zipfile.ZipFile(war, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("padding.bin", bytes(3_000_000))
    assert war.stat().st_size < 100_000
    (store / "padded.mar").write_bytes(war.read_bytes())
    unpacking = tmp_path / "tmpdir"
    unpacking.mkdir()
    monkeypatch.setenv("TMPDIR", str(unpacking))
    args = ("--enable-model-api", "--max-unpacked-size", "2000000")
    with ferry_server(store, [], tmp_path, *args) as server, server.management() as api:
        as_war = api.post("/workflows", params={"url": "padded.war"})
        as_mar = api.post("/models", params={"url": "padded.mar"})
        listed = api.get("/workflows").json()
    limit = "unpacks to more than 2000000 bytes (max_unpacked_size); refused"
    assert assert_error(as_war, 400, "InvalidModelException") == f"padded.war {limit}"
    assert assert_error(as_mar, 400, "InvalidModelException") == f"padded.mar {limit}"
    assert listed == {"workflows": []}
    assert list(unpacking.rglob("padding.bin")) == []


def test_a_body_nested_too_deeply_is_400_and_no_node_dies(
    server: RunningServer, pipeline: str
) -> None:
    """Issue 29: JSON nested 100,000 deep killed the first node's worker, twice (retried)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    with server.client() as client:
        response = client.post(
            f"/wfpredict/{pipeline}", content=deep, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, response.text
        assert "nested too deeply" in response.text
        honest = client.post(f"/wfpredict/{pipeline}", content=b"[1, 2]")
    assert honest.json() == {"double": [4.0, 6.0], "decuple": [20.0, 30.0]}
    assert "died" not in server.log()
