"""Every API at once with a built-in handler and no ``service_envelope``: the same PNG to
the built-in ``image_classifier`` as TorchServe's raw body, as KServe V1's
``{"instances": [{"data": base64}]}`` and as an Open Inference Protocol BYTES input (REST
and gRPC, as TorchServe's KServe samples send them) gets the same classes. Each
request is read through its own protocol's envelope, even in one batch."""

from __future__ import annotations

import base64
import json
import shutil
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import DEMO_STORE, write_config
from tests.fixtures.server import RunningServer, ferry_server

SAMPLES = Path(__file__).parents[2] / "examples" / "demo" / "samples"
CLASSES = {"circle", "square", "triangle", "star", "cross"}


def _windowed_shapes(store: Path) -> str:
    """The demo's ``shapes`` model again as ``trio``, its batches full at three requests
    only (the window is far longer than any test): three requests share a batch,
    whatever the timing."""
    source, scratch = store.parent / "trio-src", store.parent / "trio-config"
    with zipfile.ZipFile(DEMO_STORE / "shapes.mar") as archive:
        archive.extractall(source)
    scratch.mkdir()
    config = {
        "minWorkers": 1,
        "batchSize": 3,
        "batchPolicy": "fixed_window",
        "maxBatchDelay": 120_000,
        "image_classifier": {
            "resize": 64,
            "crop": 64,
            "mean": [0.5] * 3,
            "std": [0.5] * 3,
            "topk": 3,
        },
    }
    spec = ArchiveSpec(
        model_name="trio",
        handler="image_classifier",
        serialized_file=source / "shapes.pt",
        model_file=source / "model.py",
        config_file=write_config(scratch, config),
        extra_files=(source / "index_to_name.json",),
    )
    return write_archive(spec, store, force=True).name


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("kserve-builtin")
    store = tmp / "store"
    store.mkdir()
    shutil.copy(DEMO_STORE / "shapes.mar", store / "shapes.mar")
    models = ["shapes=shapes.mar", f"trio={_windowed_shapes(store)}"]
    with ferry_server(store, models, tmp) as running:  # no --service-envelope
        yield running


def _png() -> bytes:
    return (SAMPLES / "star.png").read_bytes()


def _v1(png: bytes) -> dict[str, Any]:
    return {"instances": [{"data": base64.b64encode(png).decode()}]}


def _v2(png: bytes) -> dict[str, Any]:
    """As TorchServe's ``mnist_v2_bytes.json``: one base64 image, shape [-1]."""
    image = {"name": "image", "shape": [-1], "datatype": "BYTES"}
    return {"inputs": [{**image, "data": [base64.b64encode(png).decode()]}]}


def _v2_classes(document: dict[str, Any]) -> dict[str, float]:
    """The classifier's answer for the one image: the envelope's one BYTES output, named
    after the input, holding the answer's object (as TorchServe's envelope answers)."""
    (output,) = document["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("image", "BYTES", [1])
    classes: dict[str, float] = output["data"][0]
    return classes


def _assert_same(expected: dict[str, float], got: dict[str, float]) -> None:
    assert list(got) == list(expected)  # the same classes, in the same order
    assert got == pytest.approx(expected, abs=1e-5)


def test_one_png_through_every_api_gets_the_same_classes(server: RunningServer) -> None:
    png = _png()
    with server.client() as client:
        torchserve = client.post("/predictions/shapes", content=png)
        v1 = client.post("/v1/models/shapes:predict", json=_v1(png))
        v2 = client.post("/v2/models/shapes/infer", json=_v2(png))
        again = client.post("/predictions/shapes", content=png)
    assert torchserve.status_code == 200, torchserve.text
    expected = torchserve.json()
    assert len(expected) == 3 and set(expected) <= CLASSES and next(iter(expected)) == "star"
    assert v1.status_code == 200, v1.text
    (v1_classes,) = v1.json()["predictions"]
    _assert_same(expected, v1_classes)
    assert v2.status_code == 200, v2.text
    answer = v2.json()
    assert answer["model_name"] == "shapes" and answer["model_version"] == "1.0"
    _assert_same(expected, _v2_classes(answer))
    assert again.json() == expected  # TorchServe's API is untouched by the others


def test_grpc_model_infer_reads_the_image_through_the_v2_envelope(server: RunningServer) -> None:
    """TorchServe's ``mnist_v2_bytes_grpc.json`` shape: the raw image in ``bytes_contents``."""
    png = _png()
    with server.client() as client:
        expected = client.post("/predictions/shapes", content=png).json()
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="image",
        datatype="BYTES",
        shape=[-1],
        contents=service_pb2.InferTensorContents(bytes_contents=[png]),
    )
    request = service_pb2.ModelInferRequest(model_name="shapes", id="g-1", inputs=[tensor])
    with grpc.insecure_channel(server.grpc_url.removeprefix("grpc://")) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            request, timeout=60
        )
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("image", "BYTES", [1])
    assert response.id == "g-1"
    # One BYTES element behind its 4-byte length: the answer's JSON.
    _assert_same(expected, json.loads(response.raw_output_contents[0][4:]))


def test_one_batch_of_three_protocols_answers_each_in_its_own(server: RunningServer) -> None:
    """``trio`` runs only full batches of three: a TorchServe, a V1 and a V2 request
    share one, and each is answered as its protocol answers."""
    png = _png()
    with server.client() as client:
        expected = client.post("/predictions/shapes", content=png).json()

    def post(path: str, **body: Any) -> Any:
        with server.client() as client:
            response = client.post(path, **body)
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(3) as pool:
        torchserve = pool.submit(post, "/predictions/trio", content=png)
        v1 = pool.submit(post, "/v1/models/trio:predict", json=_v1(png))
        v2 = pool.submit(post, "/v2/models/trio/infer", json=_v2(png))
        answers = torchserve.result(), v1.result(), v2.result()
    _assert_same(expected, answers[0])
    _assert_same(expected, answers[1]["predictions"][0])
    _assert_same(expected, _v2_classes(answers[2]))
