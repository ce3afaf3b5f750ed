"""Ferry's image as users deploy it: built here with podman (``make image``,
scripts/image.sh) and run as KServe's pod runs it. The container's arguments, environment
and security context are read from the shipped ClusterServingRuntime; it runs as user
1000 with every capability dropped and no new privileges, ``/mnt/models`` mounted
read-only in KServe's storage layout, and a read-only root filesystem (a tmpfs on /tmp,
where Ferry says at start-up it writes). The model is a handler in TorchServe's MNIST
example style that imports torchvision (the image must carry it), beside a slow model for
the drain on SIGTERM.

Skips, saying why, only where podman cannot run (not root, or podman, runc or debootstrap
missing: ``scripts/system-packages.sh`` installs them as root, as in CI). The first build
makes a Debian base with debootstrap and installs torch and torchvision (several minutes);
later builds reuse those layers.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.image import ROOT, build_image, podman_refusal, readable_by_anyone
from tests.fixtures.kserve_layout import MNIST, kserve_config
from tests.fixtures.models import HANDLERS
from tests.fixtures.polling import wait_until
from tests.fixtures.torchserve import free_port
from tests.fixtures.vision_compat import digit_png, mnist_archive

RUNTIME = ROOT / "deploy" / "kserve" / "cluster-serving-runtime.yaml"
GRACE = 30
"""KServe's (Kubernetes') default terminationGracePeriodSeconds."""
SLOW = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 1,
    "maxBatchDelay": 5,
    "responseTimeout": 120,
}
"""KServe's sample config lists mnist; the slow model is listed beside it."""


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(podman_refusal() is not None, reason=podman_refusal() or ""),
]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_image(tmp_path_factory.mktemp("image") / "build.log")


@pytest.fixture(scope="module")
def mnt_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What KServe's storage initializer leaves in /mnt/models, readable by user 1000."""
    models = tmp_path_factory.mktemp("mnt") / "models"
    (models / "config").mkdir(parents=True)
    store = models / "model-store"
    store.mkdir()
    mnist_archive(store, handler="ts_torchvision_mnist_handler.py")
    slow = ArchiveSpec(model_name="slow", handler=str(HANDLERS / "slow_handler.py"))
    write_archive(slow, store, force=True)
    (models / "config" / "config.properties").write_text(
        kserve_config({"mnist": MNIST, "slow": SLOW})
    )
    return readable_by_anyone(models)


def _kserve_container() -> dict[str, Any]:
    container: dict[str, Any] = yaml.safe_load(RUNTIME.read_text())["spec"]["containers"][0]
    return container


def _security_flags(context: dict[str, Any]) -> list[str]:
    """The container's securityContext as podman flags (what a kubelet would apply)."""
    flags = ["--user", str(context["runAsUser"])]
    flags += [f"--cap-drop={cap}" for cap in context.get("capabilities", {}).get("drop", [])]
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    assert context.get("privileged") in (None, False)
    return flags


@dataclass
class Pod:
    name: str
    http: str
    grpc: str
    metrics: str

    def logs(self) -> str:
        done = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True)
        return done.stdout + done.stderr

    def running(self) -> bool:
        done = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.Running}}", self.name],
            capture_output=True,
            text=True,
        )
        return done.stdout.strip() == "true"


def _run_args(image: str, models: Path, envelope: str, name: str) -> tuple[list[str], Pod]:
    container = _kserve_container()
    env = {entry["name"]: str(entry["value"]) for entry in container["env"]}
    env["TS_SERVICE_ENVELOPE"] = envelope  # KServe renders {{.Labels.serviceEnvelope}}
    env["PROTOCOL_VERSION"] = "v1" if envelope == "kserve" else "v2"  # KServe adds it
    ports = {8080: free_port(), 8081: free_port(), 8082: free_port()}
    runc = shutil.which("runc") or "runc"
    argv = ["podman", "run", "--detach", "--name", name, "--runtime", runc]
    argv += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
    argv += _security_flags(container["securityContext"])
    # readOnlyRootFilesystem, as hardened clusters set it: /tmp is where Ferry writes.
    argv += ["--read-only", "--tmpfs", "/tmp:rw,mode=1777"]
    argv += ["-v", f"{models}:/mnt/models:ro"]
    for inside, outside in ports.items():
        argv += ["-p", f"127.0.0.1:{outside}:{inside}"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    argv += [image, *container["args"]]
    pod = Pod(
        name,
        f"http://127.0.0.1:{ports[8080]}",
        f"127.0.0.1:{ports[8081]}",
        f"http://127.0.0.1:{ports[8082]}",
    )
    return argv, pod


@contextmanager
def _pod(image: str, models: Path, envelope: str) -> Iterator[Pod]:
    name = f"ferry-test-{uuid.uuid4().hex[:8]}"
    argv, pod = _run_args(image, models, envelope, name)
    started = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert started.returncode == 0, started.stderr
    try:

        def ready() -> bool:
            assert pod.running(), pod.logs()[-4000:]
            try:
                return httpx.get(f"{pod.http}/v2/health/ready", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until("the container to be ready", ready, timeout=240)
        yield pod
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "5", name], capture_output=True)


@pytest.fixture(scope="module")
def v2_pod(image: str, mnt_models: Path) -> Iterator[Pod]:
    with _pod(image, mnt_models, "kservev2") as pod:
        yield pod


def test_the_pod_says_where_it_writes_and_runs_as_user_1000(v2_pod: Pod) -> None:
    said = "writes only: unpacked archives, per-model packages and compile caches in /tmp/"
    # Logged as start-up ends, beside readiness turning 200: not necessarily before it.
    wait_until("the start-up line saying where it writes", lambda: said in v2_pod.logs())
    user = subprocess.run(
        ["podman", "exec", v2_pod.name, "id", "-u"], capture_output=True, text=True, check=True
    )
    assert user.stdout.strip() == "1000"


def test_readiness_and_kserves_model_endpoints_answer(v2_pod: Pod) -> None:
    with httpx.Client(base_url=v2_pod.http, timeout=60) as client:
        assert client.get("/v2/health/live").status_code == 200
        assert client.get("/v2/models/mnist/ready").status_code == 200
        assert client.get("/v1/models/mnist").json() == {"name": "mnist", "ready": True}


def test_v2_rest_answers_kserves_tensor_request(v2_pod: Pod) -> None:
    """KServe's e2e V2 request for TorchServe's MNIST: one FP32 image tensor."""
    pixels = [[[0.0] * 28 for _ in range(28)]]
    pixels[0][14][10:18] = [1.0] * 8
    payload = {
        "id": "d3b15cad-50a2-4eaf-80ce-8b0a428bd298",
        "inputs": [{"name": "input-0", "shape": [1, 28, 28], "datatype": "FP32", "data": pixels}],
    }
    answer = httpx.post(f"{v2_pod.http}/v2/models/mnist/infer", json=payload, timeout=60)
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    assert output["shape"] == [1] and output["data"][0] in range(10)


def test_grpc_v2_on_8081_answers_an_image_as_bytes(v2_pod: Pod) -> None:
    """KServe's gRPC V2 (``grpc-v2``) on the port its runtime names, through tritonclient,
    a PNG as one BYTES element (TorchServe's ``mnist_v2_bytes_grpc`` sample)."""
    import tritonclient.grpc as triton

    client = triton.InferenceServerClient(v2_pod.grpc)
    image = triton.InferInput("input-0", [1], "BYTES")
    image.set_data_from_numpy(np.array([digit_png(3)], dtype=np.object_))
    result = client.infer("mnist", [image], client_timeout=60)
    response = result.get_response()
    assert response.model_name == "mnist" and len(response.outputs) == 1
    (prediction,) = result.as_numpy(response.outputs[0].name).tolist()
    assert prediction in range(10)


SLOW_V2 = {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
"""A request to the slow model through the V2 envelope the pod is run with."""


def test_metrics_on_8082(v2_pod: Pod) -> None:
    answered = httpx.post(f"{v2_pod.http}/v2/models/slow/infer", json=SLOW_V2, timeout=60)
    assert answered.status_code == 200, answered.text
    text = httpx.get(f"{v2_pod.metrics}/metrics", timeout=60).text
    counted = [
        line
        for line in text.splitlines()
        if line.startswith("ts_inference_requests_total{") and 'model_name="slow"' in line
    ]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) >= 1, text[:2000]


def test_the_v1_pod_answers_kserves_e2e_request(image: str, mnt_models: Path) -> None:
    payload = {"instances": [{"data": base64.b64encode(digit_png(3)).decode(), "target": 0}]}
    with _pod(image, mnt_models, "kserve") as pod, httpx.Client(base_url=pod.http) as client:
        response = client.post("/v1/models/mnist:predict", json=payload, timeout=60)
        assert response.status_code == 200, response.text
        (prediction,) = response.json()["predictions"]
        assert prediction in range(10)


def test_sigterm_drains_what_is_in_flight_and_exits_0_within_the_grace_period(
    image: str, mnt_models: Path
) -> None:
    with _pod(image, mnt_models, "kservev2") as pod:

        def slow() -> int:
            url = f"{pod.http}/v2/models/slow/infer"
            return httpx.post(url, json=SLOW_V2, timeout=60).status_code

        with ThreadPoolExecutor(3) as pool:
            answers = [pool.submit(slow) for _ in range(3)]

            def queued() -> bool:
                text = httpx.get(f"{pod.metrics}/metrics", timeout=10).text
                return any(
                    line.startswith("ferry_queue_depth")
                    and 'model_name="slow"' in line
                    and float(line.rsplit(" ", 1)[1]) >= 1
                    for line in text.splitlines()
                )

            wait_until("requests queued behind the slow model's batch", queued, timeout=60)
            signalled = time.monotonic()
            subprocess.run(["podman", "kill", "--signal", "TERM", pod.name], check=True)
            statuses = [answer.result(timeout=GRACE) for answer in answers]
        exited = subprocess.run(
            ["podman", "wait", pod.name], capture_output=True, text=True, timeout=GRACE
        )
        took = time.monotonic() - signalled
        assert statuses == [200, 200, 200], pod.logs()[-3000:]
        assert exited.stdout.strip() == "0", pod.logs()[-3000:]
        assert took < GRACE, f"exited {took:.1f} s after SIGTERM"


def test_the_image_carries_a_matched_torchvision(image: str) -> None:
    probe = (
        "import json, torch, torchvision; from torchvision.ops import nms; "
        "print(json.dumps([torch.__version__, torchvision.__version__]))"
    )
    runc = shutil.which("runc") or "runc"
    limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
    done = subprocess.run(
        ["podman", "run", "--rm", "--runtime", runc, *limits, image, "python", "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    torch_version, vision_version = json.loads(done.stdout)
    assert torch_version.startswith("2.13.") and vision_version.startswith("0.28.")
