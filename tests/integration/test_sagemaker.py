"""SageMaker's serving contract on a real server: model folders in ``/opt/ml/model``'s
layout (the toolkit's test-resource patterns), invoked through ``POST /invocations`` with
JSON, CSV and NPY payloads."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.fixtures.sagemaker_models import (
    functions_model,
    load_source,
    mnist_model,
    model_tar_gz,
    scripted_model,
    toolkit_model,
    toolkit_net,
    transform_model,
)
from tests.fixtures.server import RunningServer, ferry_server

NPY = "application/x-npy"


def _npy(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sagemaker") / "store"
    mnist_model(folder / "mnist")
    functions_model(folder / "functions")
    transform_model(folder / "transform")
    scripted_model(folder / "scripted")
    toolkit_model(folder / "toolkit")
    return folder


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    models = [
        f"{name}={name}" for name in ("mnist", "functions", "transform", "scripted", "toolkit")
    ]
    with ferry_server(store, models, tmp_path_factory.mktemp("logs")) as running:
        yield running


def _invoke(server: RunningServer, model: str, body: bytes, **headers: str) -> httpx.Response:
    with server.client() as client:
        return client.post(f"/invocations?model_name={model}", content=body, headers=headers)


def _mnist_expected(store: Path, images: torch.Tensor) -> np.ndarray:
    net = load_source("mnist").model_fn(str(store / "mnist")).eval()
    with torch.no_grad():
        return net(images).numpy()  # type: ignore[no-any-return]


@pytest.mark.parametrize("accept", ["application/json", "text/csv", NPY])
@pytest.mark.parametrize("content_type", ["application/json", NPY])
def test_mnist_pattern_answers_json_and_npy_in_every_accept(
    server: RunningServer, store: Path, content_type: str, accept: str
) -> None:
    images = torch.rand(3, 1, 28, 28)
    body = (
        json.dumps(images.tolist()).encode()
        if content_type == "application/json"
        else _npy(images.numpy())
    )
    response = _invoke(server, "mnist", body, **{"Content-Type": content_type, "Accept": accept})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(accept)
    if accept == "application/json":
        scores = np.array(response.json())
    elif accept == "text/csv":
        scores = np.loadtxt(io.StringIO(response.text), delimiter=",")
    else:
        scores = np.load(io.BytesIO(response.content))
    assert scores.shape == (3, 10)
    assert np.allclose(scores, _mnist_expected(store, images), atol=1e-4)


def test_mnist_pattern_reads_csv_rows(server: RunningServer, store: Path) -> None:
    images = torch.rand(2, 784)
    csv = "\n".join(",".join(f"{v:.6f}" for v in row) for row in images.tolist())
    response = _invoke(server, "mnist", csv.encode(), **{"Content-Type": "text/csv"})
    assert response.status_code == 200, response.text
    expected = _mnist_expected(
        store, torch.tensor(np.loadtxt(io.StringIO(csv), delimiter=",")).float()
    )
    assert np.allclose(response.json(), expected, atol=1e-4)


def test_a_missing_or_any_accept_answers_json(server: RunningServer) -> None:
    for headers in ({}, {"Accept": "*/*"}):
        response = _invoke(
            server, "scripted", b"[[1, 2, 3, 4]]", **{"Content-Type": "application/json", **headers}
        )
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert len(response.json()[0]) == 3


def test_the_default_handler_serves_a_torchscript_model_pth(
    server: RunningServer, store: Path
) -> None:
    rows = np.array([[1, 2, 3, 4], [0, 0, 0, 1]], dtype=np.float32)
    response = _invoke(server, "scripted", _npy(rows), **{"Content-Type": NPY, "Accept": NPY})
    assert response.status_code == 200, response.text
    scripted = torch.jit.load(str(store / "scripted" / "model.pth"))  # type: ignore[no-untyped-call]
    expected = scripted(torch.from_numpy(rows))
    assert np.allclose(np.load(io.BytesIO(response.content)), expected.detach().numpy(), atol=1e-6)


def test_custom_attributes_reach_the_functions_that_take_the_context(server: RunningServer) -> None:
    response = _invoke(
        server,
        "functions",
        b'{"values": [1, 2]}',
        **{"Content-Type": "application/json", "X-Amzn-SageMaker-Custom-Attributes": "trace=7"},
    )
    assert response.status_code == 200, response.text
    assert response.json() == {
        "scaled": [3.0, 6.0],
        "accept": "application/json",
        "attributes": "trace=7",
    }


def test_an_inference_py_importing_the_toolkits_runs_in_the_worker(server: RunningServer) -> None:
    """``from sagemaker_inference import ...`` and the PyTorch toolkit's default handler,
    served by Ferry's shims in the worker process."""
    images = torch.rand(1, 784)
    answer = _invoke(
        server,
        "toolkit",
        json.dumps(images.tolist()).encode(),
        **{"Content-Type": "application/json"},
    )
    refused = _invoke(server, "toolkit", b"x", **{"Content-Type": "image/png"})
    assert answer.status_code == 200, answer.text
    with torch.no_grad():
        expected = torch.log_softmax(toolkit_net()(images), dim=1).numpy()
    assert np.allclose(answer.json(), expected, atol=1e-5)
    assert (refused.status_code, refused.text) == (415, "image/png is not read here")


def test_transform_fn_gets_the_raw_bytes_and_chooses_the_type(server: RunningServer) -> None:
    response = _invoke(
        server, "transform", b"\x01\x02\x03", **{"Content-Type": "application/octet-stream"}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"bytes": 3, "sum": 6.0}


def test_errors_are_answered_as_the_toolkit_answers_them(server: RunningServer) -> None:
    own_status = _invoke(server, "transform", b"x", **{"Content-Type": "text/csv"})
    assert (own_status.status_code, own_status.text) == (
        415,
        "send application/octet-stream, not text/csv",
    )
    unsupported = _invoke(server, "scripted", b"x", **{"Content-Type": "image/png"})
    assert unsupported.status_code == 500
    assert "content type 'image/png' is not one the default input_fn" in unsupported.text
    bad_accept = _invoke(
        server,
        "scripted",
        b"[[1, 2, 3, 4]]",
        **{"Content-Type": "application/json", "Accept": "text/html"},
    )
    assert bad_accept.status_code == 500 and "'text/html'" in bad_accept.text
    assert "Traceback" not in unsupported.text  # logged, not sent
    assert "transform failed for model scripted" in server.log()


def test_with_several_models_invocations_needs_model_name(server: RunningServer) -> None:
    with server.client() as client:
        response = client.post("/invocations", content=b"[1]")
        unknown = client.post("/invocations?model_name=nope", content=b"[1]")
        parameters = client.get("/execution-parameters")
        named = client.get("/execution-parameters?model_name=mnist")
    assert response.status_code == 404
    assert "functions, mnist, scripted, toolkit, transform" in response.json()["message"]
    assert unknown.status_code == 404
    assert parameters.status_code == 404  # SageMaker then uses its defaults
    assert named.json()["MaxConcurrentTransforms"] >= 1


def test_a_model_tar_gz_serves_as_the_one_model_on_invocations(tmp_path: Path) -> None:
    """SageMaker's way: one model, named ``model``, no ``model_name``; ping healthy."""
    store = tmp_path / "store"
    store.mkdir()
    model_tar_gz(transform_model(tmp_path / "unpacked"), store / "model.tar.gz")
    with ferry_server(store, ["model.tar.gz"], tmp_path) as running, running.client() as client:
        assert client.get("/ping").status_code == 200
        response = client.post(
            "/invocations", content=b"\x07", headers={"Content-Type": "application/octet-stream"}
        )
        predictions = client.post("/predictions/model", content=b"\x07")
    assert response.status_code == 200, running.log()
    assert response.json() == {"bytes": 1, "sum": 7.0}
    assert predictions.json() == {"bytes": 1, "sum": 7.0}  # the same model on TorchServe's path
