"""SageMaker's container start on a real server: the image's ``serve`` (``ferry
sagemaker-serve``) configured by SageMaker's variables alone, serving
``$SAGEMAKER_BASE_DIR/model`` on ``SAGEMAKER_BIND_TO_PORT`` of every address."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.fixtures.polling import wait_until
from tests.fixtures.sagemaker_models import gated_model, held_model, transform_model
from tests.fixtures.server import sagemaker_process, sagemaker_server, stop_process
from tests.fixtures.torchserve import free_port
from tests.integration.test_metrics import _value


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:
        return None  # not listening yet


def test_ping_answers_200_only_once_the_model_is_loaded(tmp_path: Path) -> None:
    model = gated_model(tmp_path / "ml" / "model", program="serving.py")
    port = free_port()
    variables = {
        "SAGEMAKER_PROGRAM": "serving.py",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "1",
        "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv",
    }
    process = sagemaker_process(tmp_path / "ml", tmp_path, port, variables)
    ping = f"http://127.0.0.1:{port}/ping"
    try:
        log = tmp_path / "server.log"
        wait_until("model_fn to start", (model / "loading").exists, process=process, log=log)
        statuses = {_status(ping) for _ in range(3)}
        assert 200 not in statuses  # listening (or about to), not ready
        (model / "go").touch()
        wait_until("ping 200", lambda: _status(ping) == 200, process=process, log=log)
        invocations = f"http://127.0.0.1:{port}/invocations"
        json_type = {"Content-Type": "application/json"}
        answer = httpx.post(invocations, content=b"[[1.5, 2]]", headers=json_type, timeout=60)
        too_large = httpx.post(invocations, content=b"0" * ((1 << 20) + 1), timeout=60)
    finally:
        stop_process(process)
    assert answer.status_code == 200, log.read_text()
    assert answer.headers["content-type"].startswith("text/csv")  # the default Accept
    assert answer.text.strip() == "1.5,2.0"
    assert too_large.status_code == 413  # SAGEMAKER_MAX_PAYLOAD_IN_MB
    text = log.read_text()
    assert f"http://0.0.0.0:{port}" in text
    assert process.returncode == 0


def test_the_toolkit_s_settings_reach_the_model(tmp_path: Path) -> None:
    transform_model(tmp_path / "ml" / "model")
    variables = {
        "SAGEMAKER_MODEL_SERVER_TIMEOUT": "30",
        "SAGEMAKER_TS_BATCH_SIZE": "4",
        "SAGEMAKER_TS_MAX_BATCH_DELAY": "7",
        "SAGEMAKER_SUBMIT_DIRECTORY": "s3://bucket/sourcedir.tar.gz",
    }
    with sagemaker_server(tmp_path / "ml", tmp_path, variables) as server:
        with server.client() as client:
            answer = client.post(
                "/invocations",
                content=b"\x05",
                headers={"Content-Type": "application/octet-stream"},
            )
            parameters = client.get("/execution-parameters")
        with server.management() as management:
            described = management.get("/models/model").json()[0]
    assert answer.json() == {"bytes": 1, "sum": 5.0}
    assert parameters.json() == {  # one worker taking batches of 4, TorchServe's 6.25 MB
        "MaxConcurrentTransforms": 4,
        "BatchStrategy": "SINGLE_RECORD",
        "MaxPayloadInMB": 6,
    }
    assert (described["modelName"], described["modelVersion"]) == ("model", "1.0")
    assert described["batchSize"] == 4
    assert described["maxBatchDelay"] == 7
    assert described["responseTimeout"] == 60  # SAGEMAKER_TS_RESPONSE_TIMEOUT's default wins
    assert "SAGEMAKER_SUBMIT_DIRECTORY=s3://bucket/sourcedir.tar.gz is not read" in server.log()
    assert server.url.startswith("http://127.0.0.1:")


def test_a_batch_is_predicted_together_and_each_request_answered_its_own(tmp_path: Path) -> None:
    """Four requests queue behind one that holds the worker, then go as one batch: one
    predict_fn call on their six rows, and each answer is that request's own."""
    model = held_model(tmp_path / "ml" / "model")
    variables = {"SAGEMAKER_TS_BATCH_SIZE": "4", "SAGEMAKER_TS_MAX_BATCH_DELAY": "60000"}
    inputs = [[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]], [[7.0, 8.0]], [[9.0, 0.5], [0.0, 1.0]]]
    with sagemaker_server(tmp_path / "ml", tmp_path, variables) as server:

        def invoke(rows: list[list[float]]) -> httpx.Response:
            with server.client() as client:
                body, json_type = json.dumps(rows), {"Content-Type": "application/json"}
                return client.post("/invocations", content=body, headers=json_type)

        def queued() -> float:
            return _value(server.metrics(), "ferry_queue_depth", model_name="model")

        with ThreadPoolExecutor(len(inputs) + 1) as pool:
            holder = pool.submit(invoke, [[-1.0]])
            wait_until("the worker held", (model / "holding").exists, process=server.process)
            answers = [pool.submit(invoke, rows) for rows in inputs]
            wait_until("four requests queued", lambda: queued() == 4, process=server.process)
            (model / "go").touch()
            assert holder.result().json() == [[-2.0]]
            for rows, answer in zip(inputs, answers, strict=True):
                assert answer.result().json() == (np.array(rows) * 2).tolist()
    assert (model / "calls.txt").read_text().split() == ["1", "6"]


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({}, "start-up model not found in the model store"),
        ({"SAGEMAKER_BIND_TO_PORT": "eighty"}, "SAGEMAKER_BIND_TO_PORT: expected a whole number"),
        (
            {"SAGEMAKER_SUBMIT_DIRECTORY": "s3://bucket/sourcedir.tar.gz"},
            "Ferry does not fetch code from s3://",
        ),
    ],
)
def test_a_container_that_cannot_serve_exits_2_saying_why(
    tmp_path: Path, variables: dict[str, str], message: str
) -> None:
    (tmp_path / "ml").mkdir()
    process = sagemaker_process(tmp_path / "ml", tmp_path, free_port(), variables)
    try:
        assert process.wait(timeout=120) == 2
    finally:
        stop_process(process)
    assert message in (tmp_path / "server.log").read_text()
