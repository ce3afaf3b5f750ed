"""Ferry's image run as SageMaker runs a model container: ``podman run IMAGE serve``, the
model unpacked into ``/opt/ml/model`` (read-only), port 8080 published, the image's own
user; then with ``SAGEMAKER_MULTI_MODEL=true`` and the models under ``/opt/ml/models``,
loaded, invoked and unloaded as SageMaker's agent does. The models are the toolkit's test
resource patterns (``tests/fixtures/sagemaker_models.py``), random and small.

Skips, saying why, where podman cannot run (``tests/fixtures/image.py``). The image is
built as ``make image`` builds it (several minutes the first time).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from tests.fixtures.image import build_image, podman_refusal, readable_by_anyone
from tests.fixtures.polling import wait_until
from tests.fixtures.sagemaker_models import (
    load_source,
    mnist_model,
    model_tar_gz,
    resnet_model,
    traced_resnet_model,
)
from tests.fixtures.torchserve import free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(podman_refusal() is not None, reason=podman_refusal() or ""),
]

OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_image(tmp_path_factory.mktemp("image") / "build.log")


@dataclass
class Container:
    name: str
    url: str

    def logs(self) -> str:
        done = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True)
        return done.stdout + done.stderr

    def stop(self) -> int:
        """``podman stop`` (SIGTERM, as SageMaker stops a container); its exit status."""
        subprocess.run(["podman", "stop", "--time", "30", self.name], capture_output=True)
        done = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.ExitCode}}", self.name],
            capture_output=True,
            text=True,
        )
        return int(done.stdout.strip())


@contextmanager
def _serve(image: str, volume: Path, inside: str, *env: str) -> Iterator[Container]:
    """``podman run IMAGE serve`` with ``volume`` at ``inside``, read-only, until /ping
    answers 200."""
    name = f"ferry-sagemaker-{uuid.uuid4().hex[:8]}"
    container = Container(name, f"http://127.0.0.1:{free_port()}")
    port = container.url.rsplit(":", 1)[1]
    argv = ["podman", "run", "--detach", "--name", name]
    argv += ["--runtime", shutil.which("runc") or "runc"]
    argv += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
    argv += ["-p", f"127.0.0.1:{port}:8080", "-v", f"{volume}:{inside}:ro"]
    argv += [arg for variable in env for arg in ("-e", variable)]
    started = subprocess.run([*argv, image, "serve"], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    try:

        def pinged() -> bool:
            try:
                return httpx.get(f"{container.url}/ping", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until("ping 200", pinged, timeout=240)
        yield container
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "5", name], capture_output=True)


def _png() -> bytes:
    pixels = np.random.default_rng(7).integers(0, 256, size=(36, 30, 3), dtype=np.uint8)
    stream = io.BytesIO()
    Image.fromarray(pixels).save(stream, format="PNG")
    return stream.getvalue()


def test_serve_answers_invocations_for_opt_ml_model(image: str, tmp_path: Path) -> None:
    model = readable_by_anyone(mnist_model(tmp_path / "model"))
    images = torch.rand(2, 1, 28, 28)
    with _serve(image, model, "/opt/ml/model", "SAGEMAKER_MODEL_SERVER_WORKERS=1") as container:
        answer = httpx.post(
            f"{container.url}/invocations",
            content=json.dumps(images.tolist()),
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        logs = container.logs()
        status = container.stop()
    assert answer.status_code == 200, logs[-4000:]
    net = load_source("mnist").model_fn(str(model)).eval()
    with torch.no_grad():
        assert np.allclose(answer.json(), net(images).numpy(), atol=1e-4)
    assert "SageMaker single-model endpoint: http://0.0.0.0:8080" in logs
    assert status == 0


def test_serve_as_a_multi_model_endpoint(image: str, tmp_path: Path) -> None:
    models = tmp_path / "models"
    resnet_model(models / "resnet" / "model")
    traced = traced_resnet_model(tmp_path / "traced")
    (models / "traced").mkdir()
    model_tar_gz(traced, models / "traced" / "model.tar.gz")
    readable_by_anyone(models)
    payload = _png()
    with (
        _serve(image, models, "/opt/ml/models", "SAGEMAKER_MULTI_MODEL=true") as container,
        httpx.Client(base_url=container.url, timeout=120) as client,
    ):
        empty = client.get("/models").json()
        loads = [
            client.post("/models", json={"model_name": name, "url": url})
            for name, url in (
                ("resnet", "/opt/ml/models/resnet/model"),
                ("traced", "/opt/ml/models/traced/model.tar.gz"),
            )
        ]
        again = client.post(
            "/models", json={"model_name": "resnet", "url": "/opt/ml/models/resnet/model"}
        )
        answers = [
            client.post(f"/models/{name}/invoke", content=payload, headers=OCTET)
            for name in ("resnet", "traced")
        ]
        unloaded = client.delete("/models/resnet")
        listed = client.get("/models").json()
        logs = container.logs()
    assert empty == {"models": []}
    assert [load.status_code for load in loads] == [200, 200], logs[-4000:]
    assert again.status_code == 409
    for answer in answers:
        assert answer.status_code == 200, logs[-4000:]
        assert len(answer.json()) == 10 and abs(sum(answer.json()) - 1) < 1e-5
    net = load_source("resnet").model_fn(str(models / "resnet" / "model"))
    with torch.no_grad():
        expected = torch.softmax(net(load_source("resnet").preprocess(payload)), dim=1)[0]
    assert np.allclose(answers[0].json(), expected.numpy(), atol=1e-5)
    assert unloaded.status_code == 200
    assert listed == {
        "models": [{"modelName": "traced", "modelUrl": "/opt/ml/models/traced/model.tar.gz"}]
    }
