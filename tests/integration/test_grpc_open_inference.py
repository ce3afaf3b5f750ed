"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``) on a real
server, through tritonclient's gRPC client: health, metadata, inference with raw tensors
as tritonclient sends them, errors, the model repository, batching with REST V2 requests,
the keys (the management key for the model repository) and malformed messages.

This process imports tritonclient.grpc, whose ``inference.*`` stubs collide with Ferry's
own in one process: the server runs apart, and nothing here imports
``ferry.grpc.generated.ferry_open_inference_pb2``."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ferry import __version__
from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import HANDLERS, write_config
from tests.fixtures.server import RunningServer, ferry_server

TENSOR_METADATA = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
    "outputs": [{"name": "x_out", "datatype": "FP32", "shape": [-1, 2]}],
}
TENSOR_CONFIG = {
    "minWorkers": 1,
    "batchSize": 8,
    "maxBatchDelay": 50,
    "tensor_metadata": TENSOR_METADATA,
}
# Full batches only: a batch leaves when 8 requests are in it (the window is far longer
# than any test), so which requests share a batch does not depend on timing.
WINDOWED_CONFIG = {**TENSOR_CONFIG, "batchPolicy": "fixed_window", "maxBatchDelay": 120_000}


def _tensor_archive(store: Path, name: str, config: dict[str, Any]) -> str:
    """The V2-aware handler of tests/integration/test_kserve_protocols.py (each input
    doubled or reversed, and an output ``batch``: how many requests shared its batch)."""
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
    """``tensors`` (batch 8, delay 50 ms); ``windowed`` (full batches of 8); ``spare.mar``
    (no minWorkers) in the store for the model repository calls; the model API on, no
    keys."""
    tmp = tmp_path_factory.mktemp("grpc-oip")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"tensors={_tensor_archive(store, 'tensors', TENSOR_CONFIG)}",
        f"windowed={_tensor_archive(store, 'windowed', WINDOWED_CONFIG)}",
    ]
    _tensor_archive(store, "spare", {"tensor_metadata": TENSOR_METADATA})
    with ferry_server(store, models, tmp, "--enable-model-api") as running:
        yield running


def _client(server: RunningServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=server.grpc_url.removeprefix("grpc://"))


def _input(name: str, values: np.ndarray) -> triton.InferInput:
    datatype = "FP32" if values.dtype == np.float32 else "BYTES"
    tensor = triton.InferInput(name, list(values.shape), datatype)
    tensor.set_data_from_numpy(values)  # raw_input_contents, as tritonclient always sends
    return tensor


def _status(error: InferenceServerException) -> str:
    return str(error.status())


def test_health(server: RunningServer) -> None:
    client = _client(server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tensors") and client.is_model_ready("tensors", "1.0")


def test_metadata(server: RunningServer) -> None:
    client = _client(server)
    metadata = client.get_server_metadata(as_json=True)
    assert (metadata["name"], metadata["version"]) == ("ferry", __version__)
    assert metadata["extensions"] == ["model_repository"]
    model = client.get_model_metadata("tensors", as_json=True)
    assert model == {
        "name": "tensors",
        "versions": ["1.0"],
        "platform": "pytorch",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": ["-1", "2"]}],
        "outputs": [{"name": "x_out", "datatype": "FP32", "shape": ["-1", "2"]}],
    }  # int64 as JSON strings: protobuf's JSON mapping


def test_infer_fp32_and_bytes_with_requested_outputs_and_id(server: RunningServer) -> None:
    values = np.array([[1.5, -2.0], [3.0, 4.25]], dtype=np.float32)
    words = np.array([b"abc", b"\x00\xffraw"], dtype=np.object_)
    result = _client(server).infer(
        "tensors",
        [_input("x", values), _input("w", words)],
        outputs=[triton.InferRequestedOutput("x_out"), triton.InferRequestedOutput("w_out")],
        request_id="req-7",
    )
    np.testing.assert_array_equal(result.as_numpy("x_out"), values * 2)
    # Binary BYTES reach the handler as base64 text, as over REST; it reverses that text.
    reversed_b64 = [item.decode()[::-1] for item in result.as_numpy("w_out")]
    assert reversed_b64 == ["YWJj", "AP9yYXc="]
    response = result.get_response(as_json=True)
    assert response["model_name"] == "tensors" and response["model_version"] == "1.0"
    assert response["id"] == "req-7"
    assert [o["name"] for o in response["outputs"]] == ["x_out", "w_out"]  # not "batch"


def test_every_output_without_a_request_for_some(server: RunningServer) -> None:
    values = np.ones((1, 2), dtype=np.float32)
    result = _client(server).infer("tensors", [_input("x", values)])
    names = [o["name"] for o in result.get_response(as_json=True)["outputs"]]
    assert names == ["x_out", "batch"]
    assert result.as_numpy("batch").dtype == np.int64


def test_errors_take_the_protocols_codes(server: RunningServer) -> None:
    client = _client(server)
    values = np.ones((1, 2), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="Model not found: nope") as unknown:
        client.infer("nope", [_input("x", values)])
    assert _status(unknown.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as not_ready:
        client.is_model_ready("nope")
    assert _status(not_ready.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as no_metadata:
        client.get_model_metadata("nope")
    assert _status(no_metadata.value) == "StatusCode.NOT_FOUND"

    bad_shape = _input("x", values)
    bad_shape.set_shape([3, 2])
    with pytest.raises(InferenceServerException, match="holds 6 elements, the data has 2") as bad:
        client.infer("tensors", [bad_shape])
    assert _status(bad.value) == "StatusCode.INVALID_ARGUMENT"
    unknown_output = [triton.InferRequestedOutput("nope")]
    with pytest.raises(InferenceServerException, match="unknown output 'nope'") as missing:
        client.infer("tensors", [_input("x", values)], outputs=unknown_output)
    assert _status(missing.value) == "StatusCode.INVALID_ARGUMENT"


def test_a_bytes_input_shaped_minus_one_as_torchserves_kserve_sample_sends_it(
    server: RunningServer,
) -> None:
    """A request shaped like TorchServe's ``mnist_v2_bytes_grpc.json`` (one image in
    ``bytes_contents``, shape [-1]), and the same with the image in
    ``raw_input_contents`` as tritonclient sends it: the handler gets the image, base64,
    with the size its elements give; -1 stays refused for other datatypes."""
    image = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="5f1c-image",
        datatype="BYTES",
        shape=[-1],
        contents=service_pb2.InferTensorContents(bytes_contents=[image]),
    )
    request = service_pb2.ModelInferRequest(model_name="tensors", id="img-1", inputs=[tensor])
    with grpc.insecure_channel(server.grpc_url.removeprefix("grpc://")) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(request, timeout=60)
    echoed = response.outputs[0]
    assert (echoed.name, echoed.datatype, list(echoed.shape)) == ("5f1c-image_out", "BYTES", [1])
    # One BYTES element behind its 4-byte length: the handler reversed the image's base64.
    reversed_b64 = response.raw_output_contents[0][4:].decode()
    assert base64.b64decode(reversed_b64[::-1]) == image
    assert response.id == "img-1"

    raw = _input("5f1c-image", np.array([image], dtype=np.object_))
    raw.set_shape([-1])
    result = _client(server).infer("tensors", [raw])
    (reversed_raw,) = result.as_numpy("5f1c-image_out")
    assert base64.b64decode(reversed_raw.decode()[::-1]) == image
    values = _input("x", np.ones((2,), dtype=np.float32))
    values.set_shape([-1])
    with pytest.raises(InferenceServerException, match="for BYTES inputs only") as refused:
        _client(server).infer("tensors", [values])
    assert _status(refused.value) == "StatusCode.INVALID_ARGUMENT"


def test_load_and_unload_through_the_model_repository(server: RunningServer) -> None:
    client = _client(server)
    client.load_model("spare")
    assert client.is_model_ready("spare")  # one worker, though its config names none
    values = np.ones((1, 2), dtype=np.float32)
    result = client.infer("spare", [_input("x", values)])
    np.testing.assert_array_equal(result.as_numpy("x_out"), values * 2)
    client.unload_model("spare")
    with pytest.raises(InferenceServerException) as gone:
        client.is_model_ready("spare")
    assert _status(gone.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as no_archive:
        client.load_model("absent")
    assert _status(no_archive.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as loaded:
        client.load_model("tensors")
    assert _status(loaded.value) == "StatusCode.ABORTED"


def test_a_grpc_request_batches_with_rest_v2_requests(server: RunningServer) -> None:
    """One gRPC request and seven REST V2 ones fill one batch of eight together."""
    document = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    values = np.ones((1, 2), dtype=np.float32)

    def rest() -> int:
        with server.client() as http:
            response = http.post("/v2/models/windowed/infer", json=document)
        assert response.status_code == 200, response.text
        (batch,) = [o for o in response.json()["outputs"] if o["name"] == "batch"]
        return int(batch["data"][0])

    def grpc() -> int:
        return int(_client(server).infer("windowed", [_input("x", values)]).as_numpy("batch")[0])

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(grpc)] + [pool.submit(rest) for _ in range(7)]
        assert [future.result() for future in futures] == [8] * 8


# --- the inference key, and the model API switch ------------------------------------------


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Keys on, the gRPC inference API beyond loopback; the model API off (``spare.mar``
    in the store)."""
    tmp = tmp_path_factory.mktemp("grpc-oip-auth")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"tensors={_tensor_archive(store, 'tensors', TENSOR_CONFIG)}",
        f"windowed={_tensor_archive(store, 'windowed', WINDOWED_CONFIG)}",
    ]
    _tensor_archive(store, "spare", {"tensor_metadata": TENSOR_METADATA})
    address = ("--grpc-inference-address", "0.0.0.0")
    with ferry_server(store, models, tmp, *address, auth=True) as running:
        yield running


def _keys(server: RunningServer) -> dict[str, str]:
    key_file = server.log_path.parent / "key_file.json"
    return {api: value["key"] for api, value in json.loads(key_file.read_text()).items()}


def _keyed_client(server: RunningServer) -> triton.InferenceServerClient:
    """A client of the server's gRPC inference API over loopback, where it listens."""
    port = server.grpc_url.rsplit(":", 1)[1]
    return triton.InferenceServerClient(url=f"127.0.0.1:{port}")


def test_the_inference_key_is_needed_beyond_loopback(keyed_server: RunningServer) -> None:
    keys = _keys(keyed_server)
    client = _keyed_client(keyed_server)
    values = np.ones((1, 2), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="Token Authorization failed") as denied:
        client.infer("tensors", [_input("x", values)])
    assert _status(denied.value) == "StatusCode.PERMISSION_DENIED"
    with pytest.raises(InferenceServerException):
        client.is_server_live(headers={"authorization": f"Bearer {keys['management']}"})
    inference = {"authorization": f"Bearer {keys['inference']}"}
    assert client.is_server_live(headers=inference)
    result = client.infer("tensors", [_input("x", values)], headers=inference)
    np.testing.assert_array_equal(result.as_numpy("x_out"), values * 2)


def test_without_the_model_api_the_management_key_cannot_unload_either(
    keyed_server: RunningServer,
) -> None:
    """As over REST, where the management key gets 405 for an unregistration then."""
    keys = _keys(keyed_server)
    client = _keyed_client(keyed_server)
    management = {"authorization": f"Bearer {keys['management']}"}
    with pytest.raises(InferenceServerException, match="--enable-model-api") as off:
        client.unload_model("tensors", headers=management)
    assert _status(off.value) == "StatusCode.PERMISSION_DENIED"
    with pytest.raises(InferenceServerException, match="--enable-model-api"):
        client.load_model("spare", headers=management)
    assert client.is_model_ready(
        "tensors", headers={"authorization": f"Bearer {keys['inference']}"}
    )
    with keyed_server.management() as rest:
        unregister = rest.delete("/models/tensors", headers=management)
    assert unregister.status_code == 405, unregister.text


# --- the model repository needs the management key ------------------------------------------


@pytest.fixture(scope="module", params=["127.0.0.1", "0.0.0.0"], ids=["loopback", "beyond"])
def repository_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """Keys on and the model API on; the gRPC inference API on loopback or beyond it;
    ``spare.mar`` in the store, nothing registered."""
    tmp = tmp_path_factory.mktemp("grpc-oip-repository")
    store = tmp / "store"
    store.mkdir()
    _tensor_archive(store, "spare", {"tensor_metadata": TENSOR_METADATA})
    address = ("--grpc-inference-address", request.param)
    with ferry_server(store, [], tmp, *address, "--enable-model-api", auth=True) as running:
        yield running


def test_loading_and_unloading_need_the_management_key(repository_server: RunningServer) -> None:
    """Loading and unloading are management operations wherever they are reached: neither
    no key nor the inference key may do over gRPC what REST's management API refuses."""
    keys = _keys(repository_server)
    client = _keyed_client(repository_server)
    inference = {"authorization": f"Bearer {keys['inference']}"}
    management = {"authorization": f"Bearer {keys['management']}"}
    for headers in (None, inference):
        with pytest.raises(InferenceServerException, match="Token Authorization failed") as load:
            client.load_model("spare", headers=headers)
        assert _status(load.value) == "StatusCode.PERMISSION_DENIED"
    with repository_server.management() as rest:  # the same rule over REST
        refused = rest.post("/models", params={"url": "spare.mar"}, headers=inference)
    assert refused.status_code == 401, refused.text
    with pytest.raises(InferenceServerException):
        client.is_model_ready("spare", headers=inference)  # nothing was loaded

    client.load_model("spare", headers=management)
    assert client.is_model_ready("spare", headers=inference)
    for headers in (None, inference):
        with pytest.raises(InferenceServerException, match="Token Authorization failed") as unload:
            client.unload_model("spare", headers=headers)
        assert _status(unload.value) == "StatusCode.PERMISSION_DENIED"
    assert client.is_model_ready("spare", headers=inference)
    client.unload_model("spare", headers=management)
    with pytest.raises(InferenceServerException) as gone:
        client.is_model_ready("spare", headers=inference)
    assert _status(gone.value) == "StatusCode.NOT_FOUND"


def test_the_other_calls_keep_the_inference_keys_rule(repository_server: RunningServer) -> None:
    """The management key opens only the repository calls; inference needs no key on
    loopback, the inference key beyond it."""
    keys = _keys(repository_server)
    client = _keyed_client(repository_server)
    beyond = not repository_server.grpc_url.startswith("grpc://127.0.0.1:")
    if beyond:
        with pytest.raises(InferenceServerException, match="Token Authorization failed"):
            client.is_server_live()
        with pytest.raises(InferenceServerException, match="Token Authorization failed"):
            client.is_server_live(headers={"authorization": f"Bearer {keys['management']}"})
    else:
        assert client.is_server_live()
    assert client.is_server_live(headers={"authorization": f"Bearer {keys['inference']}"})


# --- malformed requests ------------------------------------------------------------------


def _raw_call(target: str, method: str, metadata: Any = None) -> grpc.RpcError:
    """``method`` called with bytes that are no protobuf message at all."""
    with grpc.insecure_channel(target) as channel:
        path = f"/inference.GRPCInferenceService/{method}"
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
        with pytest.raises(grpc.RpcError) as raised:
            call(b"\xff\xff\xff", timeout=60, metadata=metadata)
    return raised.value


@pytest.mark.parametrize(
    ("method", "message"),
    [("ModelInfer", "ModelInferRequest"), ("RepositoryModelLoad", "RepositoryModelLoadRequest")],
)
def test_a_malformed_message_is_invalid_argument(
    server: RunningServer, method: str, message: str
) -> None:
    error = _raw_call(server.grpc_url.removeprefix("grpc://"), method)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == f"the request is not a valid {message} message"
    assert "DecodeError" not in server.log()


def test_a_malformed_message_without_the_key_is_refused_for_the_key(
    keyed_server: RunningServer,
) -> None:
    target = f"127.0.0.1:{keyed_server.grpc_url.rsplit(':', 1)[1]}"
    assert _raw_call(target, "ModelInfer").code() == grpc.StatusCode.PERMISSION_DENIED
    key = (("authorization", f"Bearer {_keys(keyed_server)['inference']}"),)
    assert _raw_call(target, "ModelInfer", key).code() == grpc.StatusCode.INVALID_ARGUMENT
