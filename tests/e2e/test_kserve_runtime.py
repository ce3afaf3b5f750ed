"""Ferry as KServe's runtime, tested by its contract without a container (test_image.py
runs the image): the shipped ClusterServingRuntime's arguments and environment, KServe's
/mnt/models layout with its sample config.properties, and KServe's own e2e TorchServe
payloads (V1 and V2)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures.kserve_layout import kserve_config
from tests.fixtures.polling import wait_until
from tests.fixtures.torchserve import free_port
from tests.fixtures.vision_compat import digit_png, mnist_archive

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
RUNTIME = ROOT / "deploy" / "kserve" / "cluster-serving-runtime.yaml"
SHIM = ROOT / "deploy" / "kserve" / "torchserve"


def _container() -> dict[str, Any]:
    document = yaml.safe_load(RUNTIME.read_text())
    container: dict[str, Any] = document["spec"]["containers"][0]
    return container


def _mnt_models(root: Path) -> Path:
    """What KServe's storage initializer leaves in /mnt/models for a .mar model."""
    models = root / "mnt" / "models"
    (models / "config").mkdir(parents=True)
    (models / "model-store").mkdir()
    mnist_archive(models / "model-store")
    config = kserve_config().replace("/mnt/models", str(models))
    (models / "config" / "config.properties").write_text(config)
    return models


@contextmanager
def _runtime(tmp_path: Path, envelope: str) -> Iterator[str]:
    """The runtime's container command with its env, as KServe renders them, the paths
    under ``tmp_path`` and free ports in place of the container's fixed ones."""
    models = _mnt_models(tmp_path)
    container = _container()
    args = [arg.replace("/mnt/models", str(models)) for arg in container["args"]]
    assert args[0] == "torchserve"
    env = {entry["name"]: str(entry["value"]) for entry in container["env"]}
    env["TS_SERVICE_ENVELOPE"] = envelope  # KServe renders {{.Labels.serviceEnvelope}}
    env["PROTOCOL_VERSION"] = "v1" if envelope == "kserve" else "v2"  # KServe adds it
    port = free_port()
    env.update(
        FERRY_INFERENCE_ADDRESS=f"http://127.0.0.1:{port}",
        FERRY_METRICS_ADDRESS=f"http://127.0.0.1:{free_port()}",
        FERRY_MANAGEMENT_ADDRESS=f"http://127.0.0.1:{free_port()}",
        FERRY_GRPC_INFERENCE_ADDRESS="127.0.0.1",
        FERRY_GRPC_INFERENCE_PORT="0",
        FERRY_GRPC_MANAGEMENT_PORT="0",
        FERRY_READY_FILE=str(tmp_path / "ready.json"),
    )
    log = tmp_path / "runtime.log"
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [str(SHIM), *args[1:]],
            env={**os.environ, **env, "PATH": path},
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        ready = tmp_path / "ready.json"
        wait_until("the runtime's ready file", ready.exists, process=process, log=log, timeout=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_the_v1_runtime_answers_kserves_e2e_request(tmp_path: Path) -> None:
    payload = {"instances": [{"data": base64.b64encode(digit_png(3)).decode(), "target": 0}]}
    with _runtime(tmp_path, "kserve") as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/v1/models/mnist").json() == {"name": "mnist", "ready": True}
        response = client.post("/v1/models/mnist:predict", json=payload)
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
        assert len(predictions) == 1 and predictions[0] in range(10)
        # TorchServe's own inference path goes through the envelope too, as in TorchServe.
        direct = client.post("/predictions/mnist", json=payload)
        assert direct.json() == {"predictions": predictions}
        raw = client.post("/predictions/mnist", content=digit_png(3))
        assert raw.status_code == 400 and "expects a JSON body" in raw.json()["message"]


def test_the_v2_runtime_answers_kserves_e2e_tensor_request(tmp_path: Path) -> None:
    pixels = [[[0.0] * 28 for _ in range(28)]]
    pixels[0][14][10:18] = [1.0] * 8
    payload = {
        "id": "d3b15cad-50a2-4eaf-80ce-8b0a428bd298",
        "inputs": [{"name": "input-0", "shape": [1, 28, 28], "datatype": "FP32", "data": pixels}],
    }
    with _runtime(tmp_path, "kservev2") as url, httpx.Client(base_url=url, timeout=60) as client:
        response = client.post("/v2/models/mnist/infer", json=payload)
        assert response.status_code == 200, response.text
        answer = response.json()
    assert answer["id"] == payload["id"] and answer["model_name"] == "mnist"
    (output,) = answer["outputs"]
    assert output["name"] == "input-0" and output["datatype"] == "INT64"
    assert output["shape"] == [1] and output["data"][0] in range(10)


def test_the_runtime_manifest_keeps_kserves_contract() -> None:
    container = _container()
    assert container["args"] == [
        "torchserve",
        "--start",
        "--model-store=/mnt/models/model-store",
        "--ts-config=/mnt/models/config/config.properties",
    ]
    env = {entry["name"]: entry["value"] for entry in container["env"]}
    assert env["TS_SERVICE_ENVELOPE"] == "{{.Labels.serviceEnvelope}}"
    runtime = yaml.safe_load(RUNTIME.read_text())["spec"]
    assert runtime["supportedModelFormats"][0]["name"] == "pytorch"
    assert runtime["annotations"]["prometheus.kserve.io/port"] == "8082"
    assert json.loads(json.dumps(runtime["protocolVersions"])) == ["v1", "v2", "grpc-v2"]
