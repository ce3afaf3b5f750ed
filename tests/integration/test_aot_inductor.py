"""PyTorch 2's compiled formats through a real server: a model compiled ahead of time by
``ferry archive --aot-inductor`` (as a user runs it) and served as an AOTInductor package
in batches of several sizes, one over the package's compiled maximum; a package compiled
for another device refused with the reason; and a ``torch.compile`` model whose second
worker loads the first worker's compiled graphs from the model's cache instead of
compiling (Inductor's own counters, as the workers log them, and the cache's files); and
TorchServe's earlier form as its example makes it (examples/pt2/torch_export_aot_compile:
a ``.so`` from ``torch._export.aot_compile`` with a batch of 2 to 15, the built-in
``image_classifier``, ``pt2: {export: {aot_compile: true}}``), answering as the same
model in TorchScript does.

Compiling needs a C++ compiler: without one these tests skip, saying so (CI has one).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from ferry.config.settings import available_cores
from ferry.errors import ArchiveError
from ferry.handlers.builtin.aot_check import answers_in_fresh_process
from ferry.store.writer import ArchiveSpec, write_archive
from ferry.worker.torch_setup import SPARE_READY
from tests.fixtures.models import HANDLERS, write_config
from tests.fixtures.polling import wait_until
from tests.fixtures.server import RunningServer, ferry_server

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="AOTInductor and torch.compile compile C++: no C++ compiler (g++) here",
)

TINY_NET = """
import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(3, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))
"""
HANDLER = str(HANDLERS / "batch_reporting_handler.py")
MAX_BATCH = 4
"""The package's compiled maximum; the model's batchSize (6) is over it."""


def _tiny_net() -> nn.Module:
    namespace: dict[str, Any] = {}
    exec(TINY_NET, namespace)  # the same source the archive holds
    torch.manual_seed(0)
    model: nn.Module = namespace["TinyNet"]().eval()
    return model


def _sources(folder: Path) -> tuple[Path, Path]:
    """The model file and its state dict."""
    folder.mkdir(parents=True, exist_ok=True)
    model_file = folder / "tiny_net.py"
    model_file.write_text(TINY_NET)
    weights = folder / "tiny.pt"
    torch.save(_tiny_net().state_dict(), weights)
    return model_file, weights


def _compiled_archive(store: Path, scratch: Path) -> subprocess.CompletedProcess[str]:
    model_file, weights = _sources(scratch)
    config = write_config(
        scratch,
        {
            "batchSize": 6,
            "maxBatchDelay": 3000,
            "batchPolicy": "fixed_window",
            "startupTimeout": 600,
        },
    )
    command = [
        sys.executable,
        "-m",
        "ferry",
        "archive",
        "--model-name",
        "tiny",
        "--handler",
        HANDLER,
        "--model-file",
        str(model_file),
        "--serialized-file",
        str(weights),
        "--config-file",
        str(config),
        "--aot-inductor",
        "--input-shape",
        "3",
        "--max-batch",
        str(MAX_BATCH),
        "--export-path",
        str(store),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)


def _for_another_device(store: Path, scratch: Path) -> None:
    """``gpu_only``: the compiled package, its metadata saying it is for CUDA."""
    with zipfile.ZipFile(store / "tiny.mar") as archive:
        package = archive.read("tiny.pt2")
    scratch.mkdir(parents=True, exist_ok=True)
    source = scratch / "source.pt2"
    source.write_bytes(package)
    target = scratch / "gpu_only.pt2"
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as forged:
        for item in original.infolist():
            data = original.read(item)
            if item.filename.endswith("_metadata.json") and "aotinductor" in item.filename:
                data = json.dumps({**json.loads(data), "AOTI_DEVICE_KEY": "cuda"}).encode()
            forged.writestr(item, data)
    spec = ArchiveSpec(model_name="gpu_only", handler=HANDLER, serialized_file=target)
    write_archive(spec, store, force=True)


def _cached_archive(store: Path, scratch: Path, name: str = "cached", workers: int = 2) -> None:
    """``cached``: the eager model with ``torch.compile``, two workers, warmed up at load."""
    model_file, weights = _sources(scratch)
    config = {
        "minWorkers": workers,
        "maxWorkers": 2,
        "startupTimeout": 600,
        "optimization": {"compile": "default", "warmup": {"input_shape": [3], "batch_sizes": [2]}},
    }
    spec = ArchiveSpec(
        model_name=name,
        handler=HANDLER,
        serialized_file=weights,
        model_file=model_file,
        config_file=write_config(scratch, config),
    )
    write_archive(spec, store, force=True)


class SmallClassifier(nn.Module):
    """A stand-in for the example's ResNet-18 (no weights are downloaded): any image size,
    ten classes. Its input is named ``x``, as the example's dynamic shapes name it."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Conv2d(3, 8, 3, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classes = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.pool(torch.relu(self.features(x))).flatten(1)
        result: torch.Tensor = self.classes(pooled)
        return result


def _torchserve_examples_archives(store: Path, scratch: Path) -> None:
    """``res_so``: TorchServe's example, step by step (a ``.so`` compiled with a dynamic
    batch of 2 to 15, archived with the built-in ``image_classifier`` and its model-config);
    ``res_ts``: the same model in TorchScript, to answer against."""
    scratch.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = SmallClassifier().eval()
    # torch's export warns about its own use of a deprecated pytree API.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        library = torch._export.aot_compile(
            model,
            (torch.randn(2, 3, 224, 224),),
            dynamic_shapes={"x": {0: torch.export.Dim("batch", min=2, max=15)}},
            options={"aot_inductor.output_path": str(scratch / "res_pt2.so")},
        )
    labels = scratch / "index_to_name.json"
    labels.write_text(json.dumps({str(i): [f"n{i:08d}", f"class_{i}"] for i in range(10)}))
    config = write_config(
        scratch,
        {"batchSize": 4, "maxBatchDelay": 200, "pt2": {"export": {"aot_compile": True}}},
    )
    common: dict[str, Any] = {"handler": "image_classifier", "extra_files": (labels,)}
    write_archive(
        ArchiveSpec(
            model_name="res_so", serialized_file=Path(str(library)), config_file=config, **common
        ),
        store,
        force=True,
    )
    scripted = scratch / "res.pt"
    torch.jit.save(torch.jit.script(model), scripted)
    write_archive(ArchiveSpec(model_name="res_ts", serialized_file=scripted, **common), store)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The store with ``tiny`` compiled by ``ferry archive``, and what it printed."""
    tmp = tmp_path_factory.mktemp("aot")
    store = tmp / "store"
    store.mkdir()
    done = _compiled_archive(store, tmp / "src")
    assert done.returncode == 0, done.stderr
    _for_another_device(store, tmp / "forged")
    _cached_archive(store, tmp / "cached-src")
    _cached_archive(store, tmp / "scaled-src", name="scaled", workers=1)
    _torchserve_examples_archives(store, tmp / "torchserve-example")
    return tmp, store, done.stderr


@pytest.fixture(scope="module")
def server(compiled: tuple[Path, Path, str]) -> Iterator[RunningServer]:
    tmp, store, _ = compiled
    models = ["tiny=tiny.mar", "gpu_only=gpu_only.mar", "cached=cached.mar", "scaled=scaled.mar"]
    models += ["res_so=res_so.mar", "res_ts=res_ts.mar"]
    (tmp / "server-tmp").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        # Its own temporary folder: the test reads the compile cache the server keeps there.
        patch.setenv("TMPDIR", str(tmp / "server-tmp"))
        patch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        with ferry_server(store, models, tmp) as running:
            yield running


def test_ferry_archive_compiles_the_model_and_says_how_close_it_answers(
    compiled: tuple[Path, Path, str],
) -> None:
    _, store, printed = compiled
    assert re.search(r"compiled in \d+ s; answers within \S+ of the model's", printed), printed
    with zipfile.ZipFile(store / "tiny.mar") as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
        assert manifest["model"]["serializedFile"] == "tiny.pt2"
        assert "modelFile" not in manifest["model"]  # no Python model code is served


def _predict(client: httpx.Client, rows: list[list[float]]) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(len(rows)) as pool:
        responses = list(pool.map(lambda row: client.post("/predictions/tiny", json=row), rows))
    for response in responses:
        assert response.status_code == 200, response.text
    return [response.json() for response in responses]


def test_the_package_answers_batches_of_several_sizes_as_the_model_does(
    server: RunningServer,
) -> None:
    model = _tiny_net()
    generator = torch.Generator().manual_seed(1)
    with server.client() as client:
        for rows in (6, 1, 3):  # 6 is over the compiled maximum (4): run as 4 + 2
            inputs = torch.randn(rows, 3, generator=generator)
            answers = _predict(client, inputs.tolist())
            assert {answer["batch"] for answer in answers} == {rows}
            with torch.no_grad():
                expected = model(inputs)
            got = torch.tensor([answer["output"] for answer in answers])
            assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), (got, expected)


def test_a_package_compiled_for_another_device_is_refused_with_the_reason(
    server: RunningServer,
) -> None:
    def describe() -> dict[str, Any]:
        with server.management() as api:
            document: dict[str, Any] = api.get("/models/gpu_only").json()[0]
            return document

    wait_until("gpu_only to give up", lambda: bool(describe().get("loadError")))
    message = describe()["loadError"]
    assert "gpu_only.pt2 was compiled for cuda and this worker runs on cpu" in message


def test_the_second_worker_loads_the_first_workers_compiled_graphs(
    server: RunningServer, compiled: tuple[Path, Path, str]
) -> None:
    tmp, _, _ = compiled

    def reports() -> list[tuple[int, int]]:
        return _cache_reports(server.log(), "cached")

    wait_until("both workers of cached to load", lambda: len(reports()) == 2)
    first, second = sorted(reports(), key=lambda report: report[1], reverse=True)
    assert first[1] > 0  # one worker compiled
    assert second == (first[1], 0)  # the other loaded every graph and compiled none
    folders = list((tmp / "server-tmp").glob("ferry-*/*/cached-compile-cache-*/torch-*"))
    assert len(folders) == 1 and any(folders[0].rglob("*")), folders
    with server.client() as client:
        answer = client.post("/predictions/cached", json=[1.0, 2.0, 3.0])
        assert answer.status_code == 200, answer.text


def _cache_reports(log: str, model: str) -> list[tuple[int, int]]:
    """Graphs loaded and compiled by each worker of ``model`` that has loaded it."""
    found = re.findall(
        rf"compile cache \S*/{model}-compile-cache-\S+: (\d+) compiled graphs loaded from it, "
        r"(\d+) compiled",
        log,
    )
    return [(int(loaded), int(made)) for loaded, made in found]


@pytest.mark.skipif(available_cores() < 2, reason="one core: every worker has 1 torch thread")
def test_a_scaled_up_worker_with_fewer_threads_loads_the_graphs_and_compiles_none(
    server: RunningServer,
) -> None:
    """``scaled`` starts with one worker, which has every core's thread; a second one
    splits the cores, so it has fewer. It loads the first worker's graphs all the same."""
    wait_until("scaled's worker to load", lambda: len(_cache_reports(server.log(), "scaled")) == 1)
    with server.management() as management:
        scaled = management.put(
            "/models/scaled", params={"min_worker": 2, "max_worker": 2, "synchronous": "true"}
        )
        assert scaled.status_code == 200, scaled.text
    wait_until(
        "the second worker's report", lambda: len(_cache_reports(server.log(), "scaled")) == 2
    )
    (_, compiled_first), (loaded, compiled) = _cache_reports(server.log(), "scaled")
    assert compiled_first > 0 and loaded > 0 and compiled == 0
    assert f"({available_cores()} torch threads) loaded from" in server.log()
    with server.client() as client:
        for _ in range(4):
            answer = client.post("/predictions/scaled", json=[1.0, 2.0, 3.0])
            assert answer.status_code == 200, answer.text


def test_a_restarted_worker_of_a_compiled_model_starts_in_the_spare_process(
    server: RunningServer,
) -> None:
    """Once ``cached`` (compiled as it loads) has its workers, a spare process waits with
    torch's compiler imported; the worker that replaces a killed one starts in it, loads
    the compiled graphs, compiles nothing, and answers."""

    def spares() -> list[int]:
        return _spares(server)

    spare = _ready_spare(server)
    with server.management() as management:
        workers = management.get("/models/cached").json()[0]["workers"]
    victim = workers[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    started = f"cached worker pid {spare} started in a spare process"
    wait_until("the replacement in the spare", lambda: started in server.log())

    def replacement_report() -> list[tuple[str, str]]:
        return re.findall(
            rf"pid {spare}\].*compile cache \S+: (\d+) compiled graphs "
            r"loaded from it, (\d+) compiled",
            server.log(),
        )

    wait_until("the replacement's compile cache report", lambda: bool(replacement_report()))
    ((loaded, made),) = replacement_report()
    assert int(loaded) > 0 and int(made) == 0
    # The spare is a worker now (its command line unchanged); a new one waits beside it.
    wait_until("another spare", lambda: any(pid != spare for pid in spares()))
    with server.client() as client:
        answer = client.post("/predictions/cached", json=[1.0, 2.0, 3.0])
        assert answer.status_code == 200, answer.text


def _spares(server: RunningServer) -> list[int]:
    """Processes started as spares that no worker has taken over (a taken one keeps its
    command line: ``scaled``'s second worker may be one)."""
    with server.management() as management:
        workers = {
            worker["pid"]
            for model in ("cached", "scaled")
            for worker in management.get(f"/models/{model}").json()[0]["workers"]
        }
    started = _children_with(server.process.pid, "--preload-compiler")
    return [pid for pid in started if pid not in workers]


def _ready_spare(server: RunningServer) -> int:
    """The spare process, once it has imported torch's compiler."""
    wait_until("a spare process", lambda: len(_spares(server)) == 1)
    (spare,) = _spares(server)

    def ready() -> bool:
        lines = server.log().splitlines()
        return any(f"[spare pid {spare}]" in line and SPARE_READY in line for line in lines)

    wait_until("the spare to import torch's compiler", ready)
    return spare


def test_a_stopped_spare_is_passed_over_and_the_worker_starts_in_a_new_process(
    server: RunningServer,
) -> None:
    """Issue 47: a spare stopped (SIGSTOP, standing in for a hang) was handed a killed
    worker's replacement, and the model had no worker until ``startupTimeout`` (600 s
    here). A spare that does not take its work within ``SPARE_TAKES_WITHIN`` is killed and
    the worker starts in a new process."""
    spare = _ready_spare(server)
    os.kill(spare, signal.SIGSTOP)
    with server.management() as management:
        victim = management.get("/models/cached").json()[0]["workers"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    passed_over = f"spare process pid {spare} did not take its work"
    wait_until("the stopped spare to be passed over", lambda: passed_over in server.log())

    def both_ready() -> bool:
        with server.management() as management:
            workers = management.get("/models/cached").json()[0]["workers"]
        pids = {worker["pid"] for worker in workers}
        ready = all(worker["status"] == "READY" for worker in workers)
        return len(workers) == 2 and ready and victim not in pids and spare not in pids

    wait_until("cached's replacement worker, in a new process", both_ready)
    assert not Path(f"/proc/{spare}/cmdline").exists() or _zombie(spare)  # killed
    with server.client() as client:
        answer = client.post("/predictions/cached", json=[1.0, 2.0, 3.0])
        assert answer.status_code == 200, answer.text


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _children_with(parent: int, argument: str) -> list[int]:
    """Processes whose parent is ``parent`` and whose command line has ``argument``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # not a process, or it ended
        if ppid == parent and argument.encode() in arguments:
            found.append(int(entry.name))
    return found


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_torchserves_aot_compiled_library_answers_as_the_model_does(
    server: RunningServer,
) -> None:
    """One image alone (a batch of 1, under the library's minimum of 2, as the example
    says works) and four at once, each against the TorchScript model's answer."""
    images = [_jpeg(seed) for seed in range(5)]
    with server.client() as client, ThreadPoolExecutor(4) as pool:

        def both(image: bytes) -> tuple[httpx.Response, httpx.Response]:
            return (
                client.post("/predictions/res_so", content=image),
                client.post("/predictions/res_ts", content=image),
            )

        answers = [both(images[0]), *pool.map(both, images[1:])]
    for compiled, scripted in answers:
        assert compiled.status_code == 200, compiled.text
        assert scripted.status_code == 200, scripted.text
        expected = scripted.json()
        got = compiled.json()
        assert list(got) == list(expected)  # the same top five, in order
        for label, probability in expected.items():
            assert got[label] == pytest.approx(probability, abs=1e-4)


SHARED_CACHE_NET = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return {forward}
"""


def _shared_cache_archive(store: Path, name: str, forward: str) -> str:
    scratch = store.parent / f"{name}-src"
    scratch.mkdir()
    model_file = scratch / "net.py"
    model_file.write_text(SHARED_CACHE_NET.format(forward=forward))
    namespace: dict[str, Any] = {}
    exec(SHARED_CACHE_NET.format(forward=forward), namespace)
    torch.save(namespace["Net"]().state_dict(), scratch / "net.pt")
    config = {
        "minWorkers": 1,
        "batchSize": 2,
        "maxBatchDelay": 10000,
        "batchPolicy": "fixed_window",
        "startupTimeout": 600,
        "optimization": {"compile": "default", "warmup": {"input_shape": [3], "batch_sizes": [2]}},
    }
    spec = ArchiveSpec(
        model_name=name,
        handler=HANDLER,
        serialized_file=scratch / "net.pt",
        model_file=model_file,
        config_file=write_config(scratch, config),
    )
    return write_archive(spec, store, force=True).name


def test_models_differing_only_in_forward_never_share_compiled_graphs(tmp_path: Path) -> None:
    """Issue 47: with ``TORCHINDUCTOR_CACHE_DIR`` set for the server, a second model whose
    ``Net`` differed from the first's only in ``forward`` loaded the first's saved graphs
    and answered every batch of 2 with the first model's result."""
    store = tmp_path / "store"
    store.mkdir()
    plus = _shared_cache_archive(store, "plus", "self.lin(x) * 0.0 + 1.0")
    minus = _shared_cache_archive(store, "minus", "self.lin(x) * 0.0 - 100.0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "shared-cache"))
        with ferry_server(store, [f"plus={plus}"], tmp_path, "--enable-model-api") as server:
            with server.management() as api:
                registered = api.post(
                    "/models", params={"url": minus, "initial_workers": 1, "synchronous": "true"}
                )
                assert registered.status_code == 200, registered.text
            with server.client() as client, ThreadPoolExecutor(2) as pool:
                for model, expected in (("minus", -100.0), ("plus", 1.0)):
                    path = f"/predictions/{model}"
                    answers = list(
                        pool.map(lambda p: client.post(p, json=[1.0, 2.0, 3.0]), [path] * 2)
                    )
                    for answer in answers:
                        assert answer.status_code == 200, answer.text
                        assert answer.json() == {"output": [expected] * 3, "batch": 2}
            saved = list((tmp_path / "shared-cache" / "ferry-precompiled").glob("*.bin"))
            assert len(saved) == 2, saved  # one file each: neither loaded the other's


def test_a_package_that_cannot_load_is_refused_by_the_child(tmp_path: Path) -> None:
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(b"not a zip file")
    with pytest.raises(ArchiveError, match=r"broken\.pt2: the compiled package could not"):
        answers_in_fresh_process(broken, torch.device("cpu"), [torch.zeros(1, 3)])
