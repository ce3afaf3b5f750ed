"""The ``kserve`` package's own clients against Ferry: ``InferenceRESTClient`` (V1 and V2,
JSON and binary tensors) and ``InferenceGRPCClient``, health, inference and errors.

kserve's ``inference.*`` stubs collide with tritonclient's in one process, so the clients
run in a subprocess (``tests/fixtures/kserve_clients.py``) and report what they got."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import HANDLERS, ts_style_archive, write_config
from tests.fixtures.server import ferry_server

# Looked up, never imported: importing kserve here would load its inference.* stubs.
if importlib.util.find_spec("kserve") is None or importlib.util.find_spec("grpc") is None:
    pytest.skip("needs kserve and grpcio (requirements-dev.txt)", allow_module_level=True)

SCRIPT = Path(__file__).parents[1] / "fixtures" / "kserve_clients.py"
TENSOR_CONFIG = {
    "minWorkers": 1,
    "batchSize": 4,
    "maxBatchDelay": 5,
    "tensor_metadata": {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
        "outputs": [{"name": "x_out", "datatype": "FP32", "shape": [-1, 2]}],
    },
}


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("kserve-clients")
    v2_store, v1_store = tmp / "v2", tmp / "v1"
    v2_store.mkdir()
    v1_store.mkdir()
    (tmp / "src").mkdir()
    spec = ArchiveSpec(
        model_name="tensors",
        handler=str(HANDLERS / "v2_tensor_handler.py"),
        config_file=write_config(tmp / "src", TENSOR_CONFIG),
    )
    write_archive(spec, v2_store)
    ts_style_archive(v1_store)
    with (
        ferry_server(v2_store, ["tensors=tensors.mar"], tmp) as v2,
        ferry_server(v1_store, ["doubler=doubler.mar"], tmp, "--service-envelope", "kserve") as v1,
    ):
        assert v2.grpc_url, "the gRPC inference API is on whenever grpcio is installed"
        arguments = {
            "v2_url": v2.url,
            "v1_url": v1.url,
            "grpc_target": v2.grpc_url.removeprefix("grpc://"),
        }
        run = subprocess.run(
            [sys.executable, str(SCRIPT), json.dumps(arguments)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        yield json.loads(run.stdout)


DOUBLED = [[3.0, -4.0], [6.0, 8.5]]


def test_rest_v2_health_and_inference(found: dict[str, Any]) -> None:
    rest = found["rest_v2"]
    assert rest["live"] and rest["ready"] and rest["model_ready"]
    assert rest["absent_ready"] is False
    for binary in (False, True):  # JSON data, then the binary tensor extension
        answer = rest[f"binary_{binary}"]
        assert answer["id"] == "k1" and answer["model"] == "tensors"
        assert answer["outputs"] == ["x_out", "batch"] and answer["x_out"] == DOUBLED


def test_rest_v2_errors(found: dict[str, Any]) -> None:
    rest = found["rest_v2"]
    assert rest["absent"][0] == 404 and "absent" in rest["absent"][1]["error"]
    assert rest["bad_shape"][0] == 400 and "shape" in rest["bad_shape"][1]["error"]


def test_rest_v1_predict_and_errors(found: dict[str, Any]) -> None:
    v1 = found["rest_v1"]
    assert v1["model_ready"] is True
    assert v1["predict"] == {"predictions": [[2.0, 4.0], [6.0, 8.0]]}
    assert v1["absent"] == [404, {"error": "Model not found: absent"}]
    assert v1["not_a_list"] == [400, {"error": 'Expected "instances" to be a list'}]


def test_grpc_v2_health_inference_and_errors(found: dict[str, Any]) -> None:
    rpc = found["grpc_v2"]
    assert rpc["live"] and rpc["ready"] and rpc["model_ready"]
    assert rpc["infer"] == {"id": "g1", "outputs": ["x_out", "batch"], "x_out": DOUBLED}
    assert rpc["absent"][0] == "NOT_FOUND" and "absent" in rpc["absent"][1]
    assert rpc["bad_shape"][0] == "INVALID_ARGUMENT" and "shape" in rpc["bad_shape"][1]
