"""What each protocol Ferry speaks costs, side by side in one run, on a no-op model and on
ResNet-18: TorchServe's REST and gRPC ``Predictions`` (a server without envelope), and the
Open Inference Protocol V2 over REST and gRPC ``ModelInfer`` (a server with
``--service-envelope kservev2``); with TorchServe 0.12's REST and gRPC beside them when
its virtual environment is there (``$TORCHSERVE_BIN_DIR``, else ``.venv-torchserve/bin``
from ``scripts/torchserve-venv.sh``; Java 17 needed).

    python benchmarks/protocols_benchmark.py
    python benchmarks/protocols_benchmark.py --archives noop --seconds 1 --rounds 1  # smoke

Every server runs for the whole of an archive's measurement; closed-loop asyncio clients
(aiohttp for REST, grpc.aio with Ferry's generated stubs for gRPC) load one protocol at a
time, after a warm-up, in rounds whose protocol order rotates. Every answer is checked
(status, then the body: ``ok``, or five class probabilities) and every failure counted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import os
import shlex
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    ROOT,
    jpeg_inputs,
    machine_description,
    noop_archive,
    publish,
    resnet18_archive,
)
from benchmarks.server import ferry_server
from ferry import __version__ as ferry_version
from ferry.grpc.generated import ferry_open_inference_pb2 as oip
from ferry.grpc.generated import ferry_open_inference_pb2_grpc as oip_grpc
from ferry.grpc.generated import ferry_torchserve_inference_pb2 as ts_pb
from ferry.grpc.generated import ferry_torchserve_inference_pb2_grpc as ts_grpc
from ferry_bench.servers import model_identity, stop_group
from ferry_bench.stats import percentile

BASELINE = "Ferry: TorchServe REST"
REQUEST_TIMEOUT = 60.0
TS_START_TIMEOUT = 300.0


class BadAnswer(Exception):
    """An answer that came back but is not the right one."""


# --- workloads -------------------------------------------------------------------------


def noop_answer(answer: bytes) -> str:
    if answer != b"ok":
        raise BadAnswer(f"expected 'ok', got {answer[:60]!r}")
    return "ok"


def classification_answer(answer: bytes) -> str:
    """Five class probabilities, as TorchServe's image_classifier answers (no mapping)."""
    try:
        top = json.loads(answer)
    except ValueError as exc:
        raise BadAnswer(f"not JSON: {answer[:60]!r}") from exc
    numbers = isinstance(top, dict) and all(
        isinstance(p, int | float) and not isinstance(p, bool) and 0 <= p <= 1 for p in top.values()
    )
    if not numbers or len(top) != 5:
        raise BadAnswer(f"not five class probabilities: {answer[:60]!r}")
    return json.dumps(top)


@dataclass(frozen=True)
class Workload:
    label: str
    model: str
    archive: Path
    batch_size: int
    max_batch_delay_ms: int
    inputs: list[bytes]
    """TorchServe's request bodies; V2 sends each as one BYTES element."""
    v2_text: Callable[[bytes], str]
    """The BYTES element as JSON text, for V2 REST."""
    content_type: str
    check: Callable[[bytes], str]
    """The answer's text, or ``BadAnswer``."""


def noop_workload(store: Path) -> Workload:
    archive = store / noop_archive(store, batch_size=8)  # maxBatchDelay 5 ms
    return Workload(
        "no-op",
        "noop",
        archive,
        8,
        5,
        [b"x"],
        bytes.decode,
        "application/octet-stream",
        noop_answer,
    )


def resnet_workload(store: Path, images: int) -> Workload:
    archive = store / resnet18_archive(store, batch_size=8, max_batch_delay_ms=10)
    return Workload(
        "ResNet-18",
        "resnet18",
        archive,
        8,
        10,
        jpeg_inputs(images, 224),
        lambda jpeg: base64.b64encode(jpeg).decode(),
        "image/jpeg",
        classification_answer,
    )


# --- protocol clients ------------------------------------------------------------------


class Client:
    """One protocol's client; ``call`` sends request ``index`` and returns the answer's
    text, raising ``BadAnswer`` (or the transport's error) for anything else."""

    def __init__(self, name: str, workload: Workload) -> None:
        self.name = name
        self.workload = workload

    async def call(self, index: int) -> str:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class RestClient(Client):
    def __init__(self, name: str, workload: Workload, url: str, bodies: list[bytes]) -> None:
        super().__init__(name, workload)
        self._url = url
        self._bodies = bodies
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        )

    async def post(self, index: int, content_type: str) -> bytes:
        body = self._bodies[index % len(self._bodies)]
        headers = {"Content-Type": content_type}
        async with self._session.post(self._url, data=body, headers=headers) as response:
            answer = await response.read()
        if response.status != 200:
            raise BadAnswer(f"HTTP {response.status}")
        return answer

    async def close(self) -> None:
        await self._session.close()


class TorchServeRest(RestClient):
    """``POST /predictions/M`` with the raw input as the body."""

    def __init__(self, name: str, workload: Workload, url: str) -> None:
        super().__init__(name, workload, f"{url}/predictions/{workload.model}", workload.inputs)

    async def call(self, index: int) -> str:
        return self.workload.check(await self.post(index, self.workload.content_type))


def v2_document(name: str, element: str) -> bytes:
    tensor = {"name": name, "shape": [1], "datatype": "BYTES", "data": [element]}
    return json.dumps({"inputs": [tensor]}).encode()


class V2Rest(RestClient):
    """``POST /v2/models/M/infer``, one BYTES input (JSON text; base64 for a JPEG)."""

    def __init__(self, name: str, workload: Workload, url: str) -> None:
        bodies = [v2_document("input-0", workload.v2_text(raw)) for raw in workload.inputs]
        super().__init__(name, workload, f"{url}/v2/models/{workload.model}/infer", bodies)

    async def call(self, index: int) -> str:
        document = json.loads(await self.post(index, "application/json"))
        try:
            output = document["outputs"][0]
            element = output["data"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise BadAnswer(f"no output: {str(document)[:60]}") from exc
        if output.get("datatype") != "BYTES" or not isinstance(element, str):
            raise BadAnswer(f"not one BYTES output: {str(output)[:60]}")
        return self.workload.check(element.encode())


class GrpcClient(Client):
    def __init__(self, name: str, workload: Workload, target: str) -> None:
        super().__init__(name, workload)
        self.channel = grpc.aio.insecure_channel(target)

    async def close(self) -> None:
        await self.channel.close()


class TorchServeGrpc(GrpcClient):
    """``Predictions`` with ``input={"data": raw input}``."""

    def __init__(self, name: str, workload: Workload, target: str) -> None:
        super().__init__(name, workload, target)
        self._stub = ts_grpc.InferenceAPIsServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self._requests = [
            ts_pb.PredictionsRequest(model_name=workload.model, input={"data": raw})
            for raw in workload.inputs
        ]

    async def call(self, index: int) -> str:
        request = self._requests[index % len(self._requests)]
        response = await self._stub.Predictions(request, timeout=REQUEST_TIMEOUT)
        return self.workload.check(response.prediction)


class V2Grpc(GrpcClient):
    """``ModelInfer`` with one BYTES input in ``contents.bytes_contents``."""

    def __init__(self, name: str, workload: Workload, target: str) -> None:
        super().__init__(name, workload, target)
        self._stub = oip_grpc.GRPCInferenceServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self._requests = [
            oip.ModelInferRequest(
                model_name=workload.model,
                inputs=[
                    oip.ModelInferRequest.InferInputTensor(
                        name="input-0",
                        datatype="BYTES",
                        shape=[1],
                        contents=oip.InferTensorContents(bytes_contents=[raw]),
                    )
                ],
            )
            for raw in workload.inputs
        ]

    async def call(self, index: int) -> str:
        request = self._requests[index % len(self._requests)]
        response = await self._stub.ModelInfer(request, timeout=REQUEST_TIMEOUT)
        if len(response.outputs) != 1 or response.outputs[0].datatype != "BYTES":
            raise BadAnswer(f"not one BYTES output: {str(response.outputs)[:60]}")
        raw = response.raw_output_contents[0] if response.raw_output_contents else b""
        (length,) = struct.unpack_from("<I", raw) if len(raw) >= 4 else (-1,)
        if length != len(raw) - 4:  # one element: its 4-byte length, then its bytes
            raise BadAnswer(f"not one BYTES element: {raw[:60]!r}")
        return self.workload.check(raw[4:])


def describe(error: BaseException) -> str:
    if isinstance(error, BadAnswer):
        return str(error)
    if isinstance(error, grpc.aio.AioRpcError):
        return f"gRPC {error.code().name}: {(error.details() or '')[:80]}"
    return f"{type(error).__name__}: {str(error)[:80]}"


# --- closed-loop load ------------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def throughput(self) -> float:
        """Correct answers per second."""
        return len(self.latencies_ms) / self.seconds


async def closed_loop(client: Client, concurrency: int, seconds: float) -> Run:
    """``concurrency`` senders, each waiting for its answer, until ``seconds`` passed."""
    run = Run(0.0)
    indexes = itertools.count()
    start = time.perf_counter()
    deadline = start + seconds

    async def sender() -> None:
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            try:
                await client.call(next(indexes))
            except Exception as error:  # counted and reported, never hidden
                run.errors[describe(error)] += 1
            else:
                run.latencies_ms.append((time.perf_counter() - sent) * 1000)

    await asyncio.gather(*(sender() for _ in range(concurrency)))
    run.seconds = time.perf_counter() - start
    return run


async def first_answer(client: Client, timeout: float) -> str:
    """The first correct answer, retried while a worker still loads; raises the last error."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await client.call(0)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)  # the model's worker may still be loading


@dataclass
class Measured:
    """One workload: per concurrency, each protocol's rounds (in round order)."""

    workload: Workload
    rounds: dict[int, dict[str, list[Run]]] = field(default_factory=dict)
    warmup_errors: dict[tuple[int, str], Counter[str]] = field(default_factory=dict)
    answers: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    """Protocols that never answered correctly, with their last error."""


async def measure(make_clients: Callable[[], list[Client]], args: Any, result: Measured) -> None:
    clients = make_clients()
    try:
        for client in clients:
            try:
                result.answers[client.name] = await first_answer(client, 120)
            except Exception as error:
                result.failed[client.name] = describe(error)
            print(f"{client.name}: {result.answers.get(client.name)!r:.70}", flush=True)
        live = [client for client in clients if client.name not in result.failed]
        for concurrency in args.concurrency:
            for client in live:
                warm = await closed_loop(client, concurrency, args.warmup)
                result.warmup_errors[(concurrency, client.name)] = warm.errors
            runs: dict[str, list[Run]] = {client.name: [] for client in live}
            for index in range(args.rounds):
                shift = index % len(live)
                for client in live[shift:] + live[:shift]:
                    runs[client.name].append(await closed_loop(client, concurrency, args.seconds))
                line = ", ".join(f"{name} {r[-1].throughput:.0f}" for name, r in runs.items())
                print(
                    f"{result.workload.label} c{concurrency} round {index + 1}: {line}", flush=True
                )
            result.rounds[concurrency] = runs
    finally:
        for client in clients:
            await client.close()


# --- servers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoints:
    url: str
    grpc_target: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def ferry(workload: Workload, tmp: Path, *flags: str) -> Iterator[Endpoints]:
    """``ferry serve`` without access log (gRPC writes none), on free ports."""
    grpc_port = free_port()
    spec = f"{workload.model}={workload.archive.name}"
    extra = ("--grpc-inference-port", str(grpc_port), "--access-log", "false", *flags)
    with ferry_server(workload.archive.parent, [spec], tmp, *extra) as server:
        yield Endpoints(server.url, f"127.0.0.1:{grpc_port}")


def torchserve_bin() -> Path | None:
    """TorchServe's bin folder, when it and a Java to run it are there."""
    folder = Path(os.environ.get("TORCHSERVE_BIN_DIR") or ROOT / ".venv-torchserve" / "bin")
    java = os.environ.get("JAVA_HOME")
    has_java = bool(java and (Path(java) / "bin" / "java").is_file()) or bool(shutil.which("java"))
    return folder if (folder / "torchserve").is_file() and has_java else None


def torchserve_version(bin_dir: Path) -> str:
    probe = "import importlib.metadata as m; print(m.version('torchserve'))"
    done = subprocess.run([str(bin_dir / "python"), "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


TORCHVISION_STAND_IN = '''"""torchvision.transforms as TorchServe's image_classifier uses
them, on PIL images, with PIL and torch (PIL's bilinear resize, as torchvision's)."""

import numpy as np
import torch
from PIL import Image


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, image):
        for transform in self.transforms:
            image = transform(image)
        return image


class Resize:
    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        width, height = image.size
        if width <= height:
            size = (self.size, int(self.size * height / width))
        else:
            size = (int(self.size * width / height), self.size)
        return image.resize(size, Image.BILINEAR)


class CenterCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        width, height = image.size
        left = int(round((width - self.size) / 2.0))
        top = int(round((height - self.size) / 2.0))
        return image.crop((left, top, left + self.size, top + self.size))


class ToTensor:
    def __call__(self, image):
        pixels = torch.from_numpy(np.array(image, dtype=np.uint8))
        return pixels.permute(2, 0, 1).float().div(255)


class Normalize:
    def __init__(self, mean, std):
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std
'''


def needs_torchvision_stand_in(bin_dir: Path) -> bool:
    check = [str(bin_dir / "python"), "-c", "import torchvision"]
    return subprocess.run(check, capture_output=True, timeout=120).returncode != 0


def _torchserve_environment(bin_dir: Path, home: Path) -> dict[str, str]:
    """As tests/fixtures/torchserve.py sets it: its own scratch (pid file, worker sockets)
    and logs, its own python for the workers, and a torchvision when it has none."""
    env = {k: v for k, v in os.environ.items() if k not in ("TS_CONFIG_FILE", "VIRTUAL_ENV")}
    env.pop("PYTHONPATH", None)
    java = shutil.which("java")
    if java is not None and "JAVA_HOME" not in env:
        env["JAVA_HOME"] = str(Path(java).resolve().parents[1])
    scratch, logs = home / "tmp", home / "logs"
    for folder in (scratch, logs):
        folder.mkdir(parents=True, exist_ok=True)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        TEMP=str(scratch),
        TMPDIR=str(scratch),
        LOG_LOCATION=str(logs),
        METRICS_LOCATION=str(logs),
    )
    if needs_torchvision_stand_in(bin_dir):
        package = home / "stand-ins" / "torchvision"
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("from . import transforms\n")
        (package / "transforms.py").write_text(TORCHVISION_STAND_IN)
        env["PYTHONPATH"] = str(package.parent)
    return env


def _torchserve_properties(workload: Workload, ports: dict[str, int]) -> str:
    name, version = model_identity(workload.archive)
    models = {
        name: {
            version: {
                "marName": workload.archive.name,
                "minWorkers": 1,
                "maxWorkers": 1,
                "batchSize": workload.batch_size,
                "maxBatchDelay": workload.max_batch_delay_ms,
                "responseTimeout": 300,
                "defaultVersion": True,
            }
        }
    }
    lines = {
        "inference_address": f"http://127.0.0.1:{ports['inference']}",
        "management_address": f"http://127.0.0.1:{ports['management']}",
        "metrics_address": f"http://127.0.0.1:{ports['metrics']}",
        "initial_worker_port": str(ports["workers"]),
        "grpc_inference_port": str(ports["grpc_inference"]),
        "grpc_management_port": str(ports["grpc_management"]),
        "disable_token_authorization": "true",
        "model_store": str(workload.archive.parent),
        "load_models": workload.archive.name,
        "models": json.dumps(models),
        "install_py_dep_per_model": "false",
        "default_workers_per_model": "1",
        "job_queue_size": "1000",
    }
    return "".join(f"{key}={value}\n" for key, value in lines.items())


def _torchserve_ready(management: str, model: str) -> dict[str, Any] | None:
    """The model's description once it has a READY worker."""
    try:
        response = httpx.get(f"{management}/models/{model}", timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    version: dict[str, Any] = response.json()[0]
    workers = version.get("workers", [])
    return version if any(w.get("status") == "READY" for w in workers) else None


@contextlib.contextmanager
def torchserve(
    workload: Workload, tmp: Path, bin_dir: Path, described: dict[str, Any]
) -> Iterator[Endpoints]:
    """TorchServe on the same archive and free ports, stopped with its JVM and workers;
    ``described`` receives its description of the model (batch size, delay)."""
    home = tmp / f"torchserve-{workload.model}"
    home.mkdir(parents=True, exist_ok=True)
    apis = ("inference", "management", "metrics", "workers", "grpc_inference", "grpc_management")
    ports = {api: free_port() for api in apis}
    properties = home / "config.properties"
    properties.write_text(_torchserve_properties(workload, ports))
    argv = [str(bin_dir / "torchserve"), "--start", "--foreground", "--ncs"]
    argv += ["--ts-config", str(properties), "--model-store", str(workload.archive.parent)]
    log_path = home / "torchserve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            env=_torchserve_environment(bin_dir, home),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=home,
            start_new_session=True,  # its JVM and workers stop with its group
        )
    try:
        management = f"http://127.0.0.1:{ports['management']}"
        deadline = time.monotonic() + TS_START_TIMEOUT
        while (description := _torchserve_ready(management, workload.model)) is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"TorchServe did not start: see {log_path}")
            time.sleep(0.5)  # polling a starting JVM and its worker
        described.update(description)
        url = f"http://127.0.0.1:{ports['inference']}"
        yield Endpoints(url, f"127.0.0.1:{ports['grpc_inference']}")
    finally:
        stop_group(process)


# --- one workload ----------------------------------------------------------------------


@dataclass
class Setup:
    bin_dir: Path | None
    """TorchServe's, when it is measured."""
    skipped: str = ""
    """Why TorchServe is not measured at all."""
    failed: dict[str, str] = field(default_factory=dict)
    """Workloads TorchServe could not serve, with why."""
    described: dict[str, dict[str, Any]] = field(default_factory=dict)
    stand_in: bool = False


def run_workload(workload: Workload, tmp: Path, args: Any, setup: Setup) -> Measured:
    result = Measured(workload)
    bin_dir = setup.bin_dir
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(ferry(workload, tmp))
        v2 = stack.enter_context(ferry(workload, tmp, "--service-envelope", "kservev2"))
        ts = None
        if bin_dir is not None:
            described: dict[str, Any] = {}
            try:
                ts = stack.enter_context(torchserve(workload, tmp, bin_dir, described))
            except RuntimeError as error:
                setup.failed[workload.label] = str(error)
            else:
                setup.described[workload.label] = described

        def clients() -> list[Client]:
            made: list[Client] = [
                TorchServeRest(BASELINE, workload, plain.url),
                TorchServeGrpc("Ferry: TorchServe gRPC", workload, plain.grpc_target),
                V2Rest("Ferry: OIP V2 REST", workload, v2.url),
                V2Grpc("Ferry: OIP V2 gRPC", workload, v2.grpc_target),
            ]
            if ts is not None:
                made.append(TorchServeRest("TorchServe: REST", workload, ts.url))
                made.append(TorchServeGrpc("TorchServe: gRPC", workload, ts.grpc_target))
            return made

        asyncio.run(measure(clients, args, result))
    return result


# --- report ----------------------------------------------------------------------------

REQUESTS = {
    "Ferry: TorchServe REST": "`POST /predictions/M`, raw body",
    "Ferry: TorchServe gRPC": '`Predictions`, `input={"data": raw}`',
    "Ferry: OIP V2 REST": "`POST /v2/models/M/infer`, one BYTES input in JSON (JPEG: base64)",
    "Ferry: OIP V2 gRPC": "`ModelInfer`, one BYTES input in `bytes_contents`",
    "TorchServe: REST": "`POST /predictions/M`, raw body",
    "TorchServe: gRPC": '`Predictions`, `input={"data": raw}`',
}


@dataclass(frozen=True)
class Row:
    name: str
    throughput: float
    p50: float
    p99: float
    ratio: float
    ratio_low: float
    ratio_high: float
    errors: int
    error_kinds: list[str]


def paired(runs: dict[str, list[Run]], name: str, against: str) -> tuple[float, ...] | None:
    """Median, lowest and highest of the per-round throughput ratios ``name / against``."""
    if name not in runs or against not in runs:
        return None
    pairs = zip(runs[name], runs[against], strict=True)
    ratios = [run.throughput / base.throughput for run, base in pairs if base.throughput]
    return (statistics.median(ratios), min(ratios), max(ratios)) if ratios else None


def _ratio(value: tuple[float, ...] | None) -> str:
    if value is None:
        return "not measured"
    median, low, high = value
    noise = ", within noise" if low <= 1 <= high else ""
    return f"{median:.2f} ({low:.2f} to {high:.2f}{noise})"


def summarise(runs: dict[str, list[Run]], warmup: dict[str, Counter[str]]) -> list[Row]:
    med = statistics.median
    nan = (float("nan"),) * 3
    rows = []
    for name, rounds in runs.items():
        ratio, low, high = paired(runs, name, BASELINE) or nan
        errors = Counter(warmup.get(name, Counter()))
        for run in rounds:
            errors.update(run.errors)
        rows.append(
            Row(
                name,
                med([run.throughput for run in rounds]),
                med([percentile(run.latencies_ms, 50) for run in rounds]),
                med([percentile(run.latencies_ms, 99) for run in rounds]),
                ratio,
                low,
                high,
                sum(errors.values()),
                [f"{count} x {kind}" for kind, count in errors.most_common(3)],
            )
        )
    return rows


def table(result: Measured) -> list[str]:
    lines = [
        "| protocol | request | concurrency | req/s | p50 ms | p99 ms | "
        "ratio to Ferry TorchServe REST (round range) | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for concurrency, runs in result.rounds.items():
        warmup = {name: result.warmup_errors[(concurrency, name)] for name in runs}
        for row in summarise(runs, warmup):
            errors = f"**{row.errors}**: {'; '.join(row.error_kinds)}" if row.errors else "0"
            lines.append(
                f"| {row.name} | {REQUESTS[row.name]} | {concurrency} | {row.throughput:.1f} | "
                f"{row.p50:.1f} | {row.p99:.1f} | {row.ratio:.2f} "
                f"({row.ratio_low:.2f} to {row.ratio_high:.2f}) | {errors} |"
            )
    for name, error in result.failed.items():
        lines.append(f"| {name} | {REQUESTS[name]} | - | never answered: {error} | | | | |")
    return lines


def findings(results: list[Measured]) -> list[str]:
    """Sentences read off the measured runs: ratios are medians of per-round ratios, with
    their range; "within noise" marks a range that holds 1.0."""
    sentences = [
        "Ratios below are medians of per-round throughput ratios with their range across "
        'rounds; "within noise" marks a range that holds 1.0.'
    ]
    spreads = []
    for result in results:
        for concurrency, runs in result.rounds.items():
            label = f"{result.workload.label} at concurrency {concurrency}"
            base = runs.get(BASELINE)
            if base is None:
                sentences.append(f"{label}: Ferry's TorchServe REST never answered.")
                continue
            level = statistics.median(run.throughput for run in base)
            text = (
                f"{label} (Ferry's TorchServe REST {level:.1f} req/s): against it, Ferry's "
                f"gRPC `Predictions` ran at "
                f"{_ratio(paired(runs, 'Ferry: TorchServe gRPC', BASELINE))}, its V2 REST at "
                f"{_ratio(paired(runs, 'Ferry: OIP V2 REST', BASELINE))}, its V2 gRPC at "
                f"{_ratio(paired(runs, 'Ferry: OIP V2 gRPC', BASELINE))}; V2 gRPC against V2 "
                f"REST {_ratio(paired(runs, 'Ferry: OIP V2 gRPC', 'Ferry: OIP V2 REST'))}."
            )
            if "TorchServe: REST" in runs:
                text += (
                    f" TorchServe 0.12's REST ran at "
                    f"{_ratio(paired(runs, 'TorchServe: REST', BASELINE))} of Ferry's, its gRPC "
                    f"at {_ratio(paired(runs, 'TorchServe: gRPC', 'Ferry: TorchServe gRPC'))} "
                    "of Ferry's gRPC."
                )
            ferry = [paired(runs, name, BASELINE) for name in runs if name.startswith("Ferry")]
            medians = [value[0] for value in ferry if value is not None]
            if medians:
                spreads.append(f"{label} {max(medians) - min(medians):.2f}")
            sentences.append(text)
    sentences.append(
        "The spread between Ferry's fastest and slowest protocol (highest minus lowest "
        f"median ratio): {'; '.join(spreads)}."
    )
    erred = sorted(
        {
            name
            for result in results
            for runs in result.rounds.values()
            for name, rounds in runs.items()
            if any(run.errors for run in rounds)
        }
        | {name for result in results for name in result.failed}
        | {
            name
            for result in results
            for (_, name), errors in result.warmup_errors.items()
            if errors
        }
    )
    sentences.append(
        f"Protocols with errors: {', '.join(erred)}." if erred else "No request failed."
    )
    return sentences


def versions(bin_dir: Path | None) -> str:
    parts = [f"Ferry {ferry_version}"] + [
        f"{package} {metadata.version(package)}" for package in ("grpcio", "protobuf", "aiohttp")
    ]
    if bin_dir is not None:
        parts.append(f"TorchServe {torchserve_version(bin_dir)} ({bin_dir.parent})")
    return ", ".join(parts)


def report(args: Any, results: list[Measured], setup: Setup) -> None:
    command = shlex.join(["python", "benchmarks/protocols_benchmark.py", *sys.argv[1:]])
    lines = [
        "# Protocol overhead: the same model behind each protocol Ferry speaks",
        "",
        f"Machine: {machine_description()}.",
        f"Versions: {versions(setup.bin_dir)}.",
        f"Command: `{command}` (one run).",
        "",
        "Two Ferry servers per archive, both running throughout, `--disable-token-auth` and "
        "`--access-log false` (Ferry's gRPC APIs write no access log, so REST does not pay "
        "for one either): one without envelope for TorchServe's REST and gRPC `Predictions`, "
        "one with `--service-envelope kservev2` for the Open Inference Protocol V2 over REST "
        "and gRPC `ModelInfer` (each request one BYTES input: base64 text in REST's JSON, raw "
        "bytes in gRPC's `bytes_contents`, which Ferry hands the handler as base64 text; the "
        "envelope gives the handler its first element, which the vision handler decodes). "
        "One worker, batch size 8 (max batch delay 5 ms no-op, 10 ms ResNet-18). "
        "The no-op model answers `ok`; ResNet-18 is random weights, TorchScript, Ferry's "
        "`image_classifier`, 224x224 JPEGs from `jpeg_inputs`.",
        "",
        f"Closed-loop asyncio clients in one process on the same machine (aiohttp for REST, "
        f"grpc.aio with Ferry's generated stubs for gRPC, one connection or channel per "
        f"protocol; the client's own cost per protocol is in the figures): a {args.warmup:g} s "
        f"warm-up per protocol, then {args.rounds} rounds of {args.seconds:g} s per protocol, "
        "the protocol order rotating each round. Medians over rounds of throughput (correct "
        "answers per second), p50 and p99; the ratio is the median of the per-round ratios "
        "to Ferry's TorchServe REST, with their range across rounds. Every answer was checked "
        "(status, then `ok` or five class probabilities); errors count warm-up and rounds.",
    ]
    if setup.skipped:
        lines += ["", f"TorchServe not measured: {setup.skipped}."]
    else:
        lines += [
            "",
            "TorchServe 0.12 ran the same archives with the same batch settings (its "
            "config.properties `models`; it described them as "
            + "; ".join(
                f"{label}: batchSize {d.get('batchSize')}, maxBatchDelay {d.get('maxBatchDelay')}"
                for label, d in setup.described.items()
            )
            + "), its own `image_classifier` for ResNet-18, its gRPC on a free port.",
        ]
        for label, error in setup.failed.items():
            lines[-1] += f" TorchServe failed to serve {label}: {error}."
        if setup.stand_in:
            lines[-1] += (
                " Its environment has no torchvision: the four transforms its image_classifier "
                "applies (Resize 256, CenterCrop 224, ToTensor, Normalize) came from a stand-in "
                "written with PIL and torch (PIL's bilinear resize, as torchvision uses for "
                "PIL images)."
            )
    for result in results:
        lines += ["", f"## {result.workload.label}", "", *table(result), ""]
        lines.append("Throughput per round (req/s, in the table's order):")
        lines.append("")
        for concurrency, runs in result.rounds.items():
            per_round = "; ".join(
                ", ".join(f"{runs[name][i].throughput:.0f}" for name in runs)
                for i in range(args.rounds)
            )
            lines.append(f"- concurrency {concurrency}: {per_round}")
        lines += ["", "First answer of each protocol (checked, truncated):", ""]
        lines += [f"- {name}: `{text[:90]}`" for name, text in result.answers.items()]
    lines += ["", "## What this shows", "", " ".join(findings(results))]
    publish(args.out, lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/protocols.md"))
    parser.add_argument("--archives", nargs="+", choices=("noop", "resnet18"), default=None)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one load run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds per protocol")
    parser.add_argument("--images", type=int, default=32, help="distinct JPEGs")
    parser.add_argument("--no-torchserve", action="store_true")
    args = parser.parse_args()
    archives = args.archives or ["noop", "resnet18"]
    tmp = Path(tempfile.mkdtemp(prefix="ferry-protocols-"))
    store = tmp / "store"
    store.mkdir()
    setup = Setup(None if args.no_torchserve else torchserve_bin())
    if setup.bin_dir is None:
        setup.skipped = "--no-torchserve" if args.no_torchserve else "no TorchServe or no Java"
    else:
        setup.stand_in = needs_torchvision_stand_in(setup.bin_dir)
    results = []
    for archive in archives:
        workload = (
            noop_workload(store) if archive == "noop" else resnet_workload(store, args.images)
        )
        results.append(run_workload(workload, tmp, args, setup))
    report(args, results, setup)


if __name__ == "__main__":
    main()
