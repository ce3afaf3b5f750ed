"""SageMaker's multi-model endpoints on a real server: ``ferry sagemaker-serve`` with
``SAGEMAKER_MULTI_MODEL=true`` (the image's ``serve``), models loaded, listed, described,
invoked and unloaded on the inference port as SageMaker's agent calls them, in the
patterns of the PyTorch toolkit's multi-model test resources (resnet18 and its traced
twin, small and random here) and its mnist and all-functions models."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from tests.fixtures.sagemaker_models import (
    functions_model,
    hungry_model,
    load_source,
    mnist_model,
    model_tar_gz,
    resnet_model,
    traced_resnet_model,
    transform_model,
    weights_model,
)
from tests.fixtures.server import RunningServer, sagemaker_server

MULTI_MODEL = {"SAGEMAKER_MULTI_MODEL": "true"}
OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``/opt/ml``: models where SageMaker puts them, ``models/NAME/model``."""
    ml = tmp_path_factory.mktemp("sagemaker_mme") / "ml"
    models = ml / "models"
    resnet_model(models / "resnet" / "model")
    traced = traced_resnet_model(ml / "unpacked" / "traced")
    (models / "traced").mkdir(parents=True)
    model_tar_gz(traced, models / "traced" / "model.tar.gz")
    mnist_model(models / "mnist" / "model")
    functions_model(models / "functions" / "model")
    transform_model(models / "transform" / "model")
    hungry_model(models / "hungry" / "model")
    return ml


@pytest.fixture(scope="module")
def server(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with sagemaker_server(base, tmp_path_factory.mktemp("mme_logs"), MULTI_MODEL) as running:
        yield running


def _load(client: httpx.Client, name: str, url: Path | str) -> httpx.Response:
    return client.post("/models", json={"model_name": name, "url": str(url)})


def _image() -> bytes:
    pixels = np.random.default_rng(5).integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
    stream = io.BytesIO()
    Image.fromarray(pixels).save(stream, format="PNG")
    return stream.getvalue()


def _expected_scores(model: torch.nn.Module | torch.jit.ScriptModule, image: bytes) -> np.ndarray:
    batch = load_source("resnet").preprocess(image)
    with torch.no_grad():
        return torch.softmax(model(batch), dim=1)[0].numpy()


def test_ping_is_200_and_no_model_is_loaded_at_start(server: RunningServer) -> None:
    with server.client() as client:
        assert client.get("/ping").status_code == 200
        assert client.get("/models").json() == {"models": []}


def test_the_resnet_patterns_load_list_describe_invoke_and_unload(
    server: RunningServer, base: Path
) -> None:
    resnet_url = base / "models" / "resnet" / "model"
    traced_url = base / "models" / "traced" / "model.tar.gz"
    image = _image()
    with server.client() as client:
        loaded = _load(client, "resnet", resnet_url)
        loaded_traced = _load(client, "traced", traced_url)
        listed = client.get("/models").json()["models"]
        described = client.get("/models/traced")
        eager = client.post("/models/resnet/invoke", content=image, headers=OCTET)
        traced = client.post(
            "/models/traced/invoke",
            content=image,
            headers={**OCTET, "X-Amzn-SageMaker-Target-Model": "traced.tar.gz"},
        )
        refused = client.post(
            "/models/resnet/invoke", content=image, headers={"Content-Type": "image/png"}
        )
        unloaded = client.delete("/models/resnet")
        after = client.get("/models").json()["models"]
        gone = client.post("/models/resnet/invoke", content=image, headers=OCTET)
        client.delete("/models/traced")
    assert loaded.status_code == 200, server.log()
    assert loaded.json() == {
        "status": 'Model "resnet" Version: 1.0 registered with 1 initial workers'
    }
    assert loaded_traced.status_code == 200, server.log()
    assert {"modelName": "resnet", "modelUrl": str(resnet_url)} in listed
    assert {"modelName": "traced", "modelUrl": str(traced_url)} in listed
    assert described.json() == {"modelName": "traced", "modelUrl": str(traced_url)}
    assert eager.status_code == 200 and traced.status_code == 200
    net = load_source("resnet").model_fn(str(resnet_url))
    assert np.allclose(eager.json(), _expected_scores(net, image), atol=1e-5)
    scripted = torch.jit.load(str(base / "unpacked" / "traced" / "traced_resnet.pt"))  # type: ignore[no-untyped-call]
    assert np.allclose(traced.json(), _expected_scores(scripted, image), atol=1e-5)
    assert len(eager.json()) == 10 and abs(sum(eager.json()) - 1) < 1e-5
    assert refused.status_code == 500 and "must be application/octet-stream" in refused.text
    assert unloaded.json() == {"status": 'Model "resnet" unregistered'}
    assert {"modelName": "resnet", "modelUrl": str(resnet_url)} not in after
    assert gone.status_code == 404


def test_the_mnist_and_all_functions_patterns_answer_as_invocations(
    server: RunningServer, base: Path
) -> None:
    images = torch.rand(2, 1, 28, 28)
    with server.client() as client:
        assert _load(client, "mnist", base / "models" / "mnist" / "model").status_code == 200
        assert (
            _load(client, "functions", base / "models" / "functions" / "model").status_code == 200
        )
        scores = client.post(
            "/models/mnist/invoke",
            content=json.dumps(images.tolist()),
            headers={"Content-Type": "application/json", "Accept": "text/csv"},
        )
        functions = client.post(
            "/models/functions/invoke",
            content=b'{"values": [1, 2]}',
            headers={
                "Content-Type": "application/json",
                "X-Amzn-SageMaker-Custom-Attributes": "trace=9",
            },
        )
        for name in ("mnist", "functions"):
            client.delete(f"/models/{name}")
    assert scores.status_code == 200, scores.text
    assert scores.headers["content-type"].startswith("text/csv")
    net = load_source("mnist").model_fn(str(base / "models" / "mnist" / "model")).eval()
    with torch.no_grad():
        expected = net(images).numpy()
    assert np.allclose(np.loadtxt(io.StringIO(scores.text), delimiter=","), expected, atol=1e-4)
    assert functions.json() == {
        "scaled": [3.0, 6.0],
        "accept": "application/json",
        "attributes": "trace=9",
    }


def test_a_loaded_name_is_409_and_unknown_models_or_urls_404(
    server: RunningServer, base: Path
) -> None:
    url = base / "models" / "transform" / "model"
    with server.client() as client:
        first = _load(client, "transform", url)
        again = _load(client, "transform", base / "models" / "mnist" / "model")
        missing_url = _load(client, "banana", base / "models" / "banana" / "model")
        outside = _load(client, "outside", "/etc")
        no_name = client.post("/models", json={"url": str(url)})
        unknown = [
            client.get("/models/nope"),
            client.delete("/models/nope"),
            client.post("/models/nope/invoke", content=b"\x01", headers=OCTET),
        ]
        still = client.post("/models/transform/invoke", content=b"\x02", headers=OCTET)
        client.delete("/models/transform")
    assert first.status_code == 200
    assert again.status_code == 409
    assert missing_url.status_code == 404
    assert outside.status_code == 400  # outside the model store (SAGEMAKER_BASE_DIR)
    assert no_name.status_code == 400
    assert [response.status_code for response in unknown] == [404, 404, 404]
    assert still.json() == {"bytes": 1, "sum": 2.0}  # the 409 left the first one alone


def test_a_model_that_cannot_fit_the_memory_budget_is_507_and_not_kept(tmp_path: Path) -> None:
    weights_model(tmp_path / "ml" / "models" / "large" / "model", megabytes=2)
    variables = {**MULTI_MODEL, "FERRY_MODEL_MEMORY_BUDGET_MB": "1"}
    with (
        sagemaker_server(tmp_path / "ml", tmp_path, variables) as running,
        running.client() as client,
    ):
        refused = _load(client, "large", tmp_path / "ml" / "models" / "large" / "model")
        listed = client.get("/models").json()
        invoked = client.post("/models/large/invoke", content=b"\x01", headers=OCTET)
    assert refused.status_code == 507, running.log()
    assert refused.json()["type"] == "InsufficientMemoryException"
    assert "does not fit the model memory budget (1 MiB)" in refused.json()["message"]
    assert listed == {"models": []}
    assert invoked.status_code == 404


def test_a_model_that_runs_out_of_memory_as_it_loads_is_507_and_not_kept(
    server: RunningServer, base: Path
) -> None:
    """SageMaker evicts a model and retries on 507; a 500 would fail the load for good."""
    with server.client() as client:
        refused = _load(client, "hungry", base / "models" / "hungry" / "model")
        listed = client.get("/models").json()["models"]
    assert refused.status_code == 507, server.log()
    assert refused.json()["type"] == "InsufficientMemoryException"
    assert "ran out of memory while loading" in refused.json()["message"]
    # The handler's own error, raised from the MemoryError it wraps, is what it said.
    assert "RuntimeError: loading the weights failed" in refused.json()["message"]
    assert all(model["modelName"] != "hungry" for model in listed)
