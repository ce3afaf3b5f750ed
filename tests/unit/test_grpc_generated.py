"""The committed gRPC modules are exactly what ``scripts/generate-grpc.sh`` makes of the
.proto files, and they carry TorchServe's wire names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ferry.grpc.generated import ferry_torchserve_inference_pb2 as inference
from ferry.grpc.generated import ferry_torchserve_management_pb2 as management

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "ferry" / "grpc" / "generated"
SCRIPT = ROOT / "scripts" / "generate-grpc.sh"


def _generated_files(folder: Path) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in sorted(folder.iterdir())
        if path.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))
    }


def test_the_committed_modules_match_a_fresh_generation(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr
    fresh, committed = _generated_files(tmp_path), _generated_files(GENERATED)
    assert sorted(fresh) == sorted(committed)
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, (
        f"run scripts/generate-grpc.sh (with requirements-dev.txt's grpcio-tools): {stale}"
    )


def test_the_services_have_torchserves_names_and_numbers() -> None:
    service = inference.DESCRIPTOR.services_by_name["InferenceAPIsService"]
    assert service.full_name == "org.pytorch.serve.grpc.inference.InferenceAPIsService"
    methods = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert methods == {
        "Ping": (False, False),
        "Predictions": (False, False),
        "StreamPredictions": (False, True),
        "StreamPredictions2": (True, True),
    }
    request = inference.PredictionsRequest.DESCRIPTOR.fields_by_name
    assert {name: field.number for name, field in request.items()} == {
        "model_name": 1,
        "model_version": 2,
        "input": 3,
        "sequence_id": 4,
    }
    response = inference.PredictionResponse.DESCRIPTOR.fields_by_name
    status = response["status"].message_type
    assert status is not None and status.full_name == "google.rpc.Status"
    managing = management.DESCRIPTOR.services_by_name["ManagementAPIsService"]
    assert managing.full_name == "org.pytorch.serve.grpc.management.ManagementAPIsService"
    register = management.RegisterModelRequest.DESCRIPTOR.fields_by_name
    assert (register["url"].number, register["startup_timeout"].number) == (9, 11)
    scale = management.ScaleWorkerRequest.DESCRIPTOR.fields_by_name
    assert (scale["max_worker"].number, scale["min_worker"].number) == (3, 4)
