"""KServe's protocols on the inference port, through real clients: the Open Inference
Protocol V2 (tritonclient's HTTP client, JSON and binary tensors) and KServe V1, with and
without TorchServe's envelopes, and their error paths."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import HANDLERS, ts_style_archive, write_config
from tests.fixtures.server import RunningServer, ferry_server

TENSOR_CONFIG = {
    "minWorkers": 1,
    "batchSize": 8,
    "maxBatchDelay": 50,
    "tensor_metadata": {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
        "outputs": [{"name": "x_out", "datatype": "FP32", "shape": [-1, 2]}],
    },
}


# Full batches only: a batch leaves when 8 requests are in it (the window is far longer
# than any test), so which requests share a batch does not depend on timing.
WINDOWED_CONFIG = {**TENSOR_CONFIG, "batchPolicy": "fixed_window", "maxBatchDelay": 120_000}


def _tensor_archive(store: Path, name: str, config: dict[str, object]) -> str:
    scratch = store.parent / f"{name}-src"
    scratch.mkdir(exist_ok=True)
    spec = ArchiveSpec(
        model_name=name,
        handler=str(HANDLERS / "v2_tensor_handler.py"),
        config_file=write_config(scratch, config),
    )
    return write_archive(spec, store, force=True).name


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """``tensors`` (batch 8, delay 50 ms) and ``windowed`` (full batches of 8 only)."""
    tmp = tmp_path_factory.mktemp("kserve")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"tensors={_tensor_archive(store, 'tensors', TENSOR_CONFIG)}",
        f"windowed={_tensor_archive(store, 'windowed', WINDOWED_CONFIG)}",
    ]
    with ferry_server(store, models, tmp, "--max-request-size", "4096") as srv:
        yield srv


def _explaining_archive(store: Path) -> str:
    scratch = store.parent / "explainer-src"
    scratch.mkdir(exist_ok=True)
    spec = ArchiveSpec(
        model_name="explainer",
        handler=str(HANDLERS / "ts_explaining_handler.py"),
        config_file=write_config(scratch, {"minWorkers": 1}),
    )
    return write_archive(spec, store, force=True).name


@pytest.fixture(scope="module")
def enveloped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """TorchServe's handlers unchanged behind the kservev2 envelope, as KServe runs them:
    ``doubler`` (cannot explain), ``explainer`` (``get_insights``)."""
    tmp = tmp_path_factory.mktemp("kservev2")
    store = tmp / "store"
    store.mkdir()
    ts_style_archive(store)
    models = ["doubler=doubler.mar", f"explainer={_explaining_archive(store)}"]
    extra = ("--service-envelope", "kservev2")
    with ferry_server(store, models, tmp, *extra) as srv:
        yield srv


def _client(server: RunningServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=server.url.removeprefix("http://"))


def _input(name: str, values: np.ndarray, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput(
        name, list(values.shape), "FP32" if values.dtype == np.float32 else "BYTES"
    )
    tensor.set_data_from_numpy(values, binary_data=binary)
    return tensor


def test_health_and_metadata(server: RunningServer) -> None:
    client = _client(server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tensors") and client.is_model_ready("tensors", "1.0")
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data"]
    metadata = client.get_model_metadata("tensors")
    assert metadata == {
        "name": "tensors",
        "versions": ["1.0"],
        "platform": "pytorch",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
        "outputs": [{"name": "x_out", "datatype": "FP32", "shape": [-1, 2]}],
    }
    assert not client.is_model_ready("nope")


@pytest.mark.parametrize("binary", [False, True])
def test_infer_json_and_binary_tensors(server: RunningServer, binary: bool) -> None:
    values = np.array([[1.5, -2.0], [3.0, 4.25]], dtype=np.float32)
    words = np.array([b"abc", b"hello"], dtype=np.object_)
    requested = [triton.InferRequestedOutput("x_out", binary_data=binary)]
    result = _client(server).infer(
        "tensors",
        [_input("x", values, binary), _input("w", words, binary)],
        outputs=requested,
        request_id="req-7",
    )
    np.testing.assert_array_equal(result.as_numpy("x_out"), values * 2)
    response = result.get_response()
    assert response["model_name"] == "tensors" and response["model_version"] == "1.0"
    assert response["id"] == "req-7"
    assert [o["name"] for o in response["outputs"]] == ["x_out"]  # only what was asked


def test_binary_bytes_inputs_arrive_base64_encoded(server: RunningServer) -> None:
    """JSON cannot carry raw bytes: binary BYTES elements reach the handler as base64,
    as KServe's TorchServe wrapper sent them."""
    words = np.array([b"\x00\xffraw"], dtype=np.object_)
    result = _client(server).infer("tensors", [_input("w", words, True)])
    (reversed_b64,) = result.as_numpy("w_out")
    assert reversed_b64.decode()[::-1] == "AP9yYXc="


def test_requests_from_any_protocol_batch_together(server: RunningServer) -> None:
    """Four V2 requests with JSON tensors and four with binary ones fill one batch of
    eight: each is one request to the handler, however its tensors travelled."""
    from concurrent.futures import ThreadPoolExecutor

    values = np.ones((1, 2), dtype=np.float32)

    def v2(binary: bool) -> int:
        result = _client(server).infer("windowed", [_input("x", values, binary)])
        return int(result.as_numpy("batch")[0])

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(v2, binary) for binary in [False, True] * 4]
        batch_sizes = [future.result() for future in futures]
    assert batch_sizes == [8] * 8


def test_errors_are_v2_error_bodies(server: RunningServer) -> None:
    client = _client(server)
    with pytest.raises(InferenceServerException, match="Model not found: nope"):
        client.infer("nope", [_input("x", np.ones((1, 2), np.float32), False)])
    with server.client() as http:
        cases = [
            (
                {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2]}]},
                "holds 4 elements, the data has 2",
            ),
            (
                {"inputs": [{"name": "x", "shape": [1], "datatype": "FP42", "data": [1]}]},
                "datatype 'FP42' is not one of",
            ),
            (
                {"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [300]}]},
                "300 is not a valid INT8 element",
            ),
            ({"inputs": []}, "'inputs' must be a non-empty list"),
            (
                {
                    "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                    "outputs": [{"name": "nope"}],
                },
                "unknown output 'nope'",
            ),
        ]
        for document, message in cases:
            response = http.post("/v2/models/tensors/infer", json=document)
            assert response.status_code == 400, response.text
            assert message in response.json()["error"]
        garbled = http.post(
            "/v2/models/tensors/infer",
            content=b'{"inputs": []}',
            headers={"inference-header-content-length": "99"},
        )
        assert garbled.status_code == 400 and "exceeds the body" in garbled.json()["error"]
        huge = {
            "inputs": [{"name": "x", "shape": [2000], "datatype": "FP32", "data": [1.0] * 2000}]
        }
        too_big = http.post("/v2/models/tensors/infer", json=huge)
        assert too_big.status_code == 413 and "error" in too_big.json()
        unknown = http.get("/v2/models/nope")
        assert unknown.status_code == 404 and unknown.json() == {"error": "Model not found: nope"}


def test_kservev2_envelope_runs_a_torchserve_handler_unchanged(enveloped: RunningServer) -> None:
    values = np.array([[1.0, 2.0]], dtype=np.float32)
    inputs = [_input("input-0", values, False)]
    requested = [triton.InferRequestedOutput("input-0", binary_data=False)]
    result = _client(enveloped).infer("doubler", inputs, outputs=requested, request_id="d3")
    response = result.get_response()
    # TorchServe's kservev2 envelope: output i named after input i, flat, typed by value.
    assert response["outputs"] == [
        {"name": "input-0", "shape": [2], "datatype": "FP64", "data": [2.0, 4.0]}
    ]
    assert response["id"] == "d3"
    binary = _client(enveloped).infer("doubler", inputs)  # tritonclient asks for binary
    np.testing.assert_array_equal(binary.as_numpy("input-0"), [2.0, 4.0])


def test_v2_explain_answers_the_handlers_explanations_as_a_v2_response(
    enveloped: RunningServer,
) -> None:
    """TorchServe's ``POST /v2/models/M/explain``: the infer request, sent to the handler
    as an explanation (its ``get_insights``), answered in the V2 response shape."""
    document = {
        "id": "why-1",
        "inputs": [{"name": "input-0", "shape": [1, 2], "datatype": "FP32", "data": [[3, 5]]}],
    }
    with enveloped.client() as http:
        explained = http.post("/v2/models/explainer/explain", json=document)
        versioned = http.post("/v2/models/explainer/versions/1.0/explain", json=document)
        inferred = http.post("/v2/models/explainer/infer", json=document)
        unable = http.post("/v2/models/doubler/explain", json=document)
        unknown = http.post("/v2/models/nope/explain", json=document)
        wrong_method = http.get("/v2/models/explainer/explain")
    assert explained.status_code == 200, explained.text
    assert explained.json() == {
        "model_name": "explainer",
        "model_version": "1.0",
        "id": "why-1",
        "outputs": [{"name": "input-0", "shape": [2], "datatype": "FP64", "data": [2.0, 2.0]}],
    }  # d(2x)/dx for each value; predictions are the doubled values
    assert versioned.status_code == 200 and versioned.json() == explained.json()
    assert inferred.json()["outputs"][0]["data"] == [6.0, 10.0]
    assert unable.status_code == 501, unable.text
    assert "does not explain its predictions" in unable.json()["error"]
    assert unknown.status_code == 404 and unknown.json() == {"error": "Model not found: nope"}
    assert wrong_method.status_code == 405


def test_a_bytes_input_shaped_minus_one_as_torchserves_kserve_sample_sends_it(
    enveloped: RunningServer,
) -> None:
    """A request shaped like TorchServe's ``mnist_v2_bytes.json``: one base64 image in a
    BYTES input of shape [-1]. The envelope hands the handler the image, as TorchServe's
    does; -1 stays refused for other datatypes."""
    image = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(40))).decode()
    document = {
        "id": "c0ffee-42",
        "inputs": [{"data": [image], "datatype": "BYTES", "name": "7e0d-image", "shape": [-1]}],
    }
    with enveloped.client() as http:
        inferred = http.post("/v2/models/explainer/infer", json=document)
        explained = http.post("/v2/models/explainer/explain", json=document)
        fp32 = {"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1.0]}]}
        refused = http.post("/v2/models/explainer/infer", json=fp32)
    assert inferred.status_code == 200, inferred.text
    assert inferred.json() == {
        "model_name": "explainer",
        "model_version": "1.0",
        "id": "c0ffee-42",
        "outputs": [{"name": "7e0d-image", "shape": [1], "datatype": "FP64", "data": [96.0]}],
    }  # twice the image's 48 bytes
    assert explained.json()["outputs"][0]["data"] == [2.0]
    assert refused.status_code == 400
    assert "for BYTES inputs only" in refused.json()["error"]


def test_kserve_v1_models_and_errors(server: RunningServer) -> None:
    with server.client() as http:
        assert http.get("/v1/models").json() == {"models": ["tensors", "windowed"]}
        assert http.get("/v1/models/tensors").json() == {"name": "tensors", "ready": True}
        missing = http.get("/v1/models/nope")
        assert missing.status_code == 404 and missing.json() == {"error": "Model not found: nope"}
        bad = http.post("/v1/models/tensors:predict", json={"instances": "nope"})
        assert bad.status_code == 400 and bad.json() == {
            "error": 'Expected "instances" to be a list'
        }


def test_v1_with_the_kserve_envelope(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    ts_style_archive(store)
    extra = ("--service-envelope", "kserve")
    with (
        ferry_server(store, ["doubler=doubler.mar"], tmp_path, *extra) as srv,
        srv.client() as http,
    ):
        body = {"instances": [{"data": [1, 2]}, {"data": [3, 4]}]}
        response = http.post("/v1/models/doubler:predict", json=body)
        assert response.status_code == 200, response.text
        assert response.json() == {"predictions": [[2.0, 4.0], [6.0, 8.0]]}
        assert json.loads(http.get("/v1/models/doubler").text)["ready"] is True
