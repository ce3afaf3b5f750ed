"""Weights keepers on a real server, by their CPU stand-in (``weights_keeper: all``: the
keeper's copy in shared memory where a GPU's would be exported by CUDA IPC): the workers
of a version import one copy from one keeper and answer as the model does; a killed
worker's replacement imports it again from the same keeper; a killed keeper takes its
workers along, the request one held is answered and the model comes back on a new
keeper; a handler's write into the copy fails its request and brings a fresh copy; two
versions have a keeper each; scaled to zero, the keeper goes."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import HANDLERS, save_torchscript, write_config
from tests.fixtures.polling import wait_until
from tests.fixtures.processes import descendants_of
from tests.fixtures.server import RunningServer, ferry_server

pytestmark = pytest.mark.integration

WORKERS = 2
ROW = [float(i % 7) / 7 for i in range(256)]
KEEPER_MODULE = "ferry.worker.weights_keeper"


class Narrow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(256, 512)
        self.second = nn.Linear(512, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.second(torch.relu(self.first(x)))
        return out


@pytest.fixture(scope="module")
def model() -> Narrow:
    torch.manual_seed(0)
    return Narrow().eval()


def _archive(store: Path, model: Narrow, name: str, version: str, workers: int) -> str:
    scratch = store.parent / f"{name}-{version}-src"
    scratch.mkdir(parents=True)
    save_torchscript(model, scratch / "narrow.pt")
    config = {
        "minWorkers": workers,
        "maxWorkers": workers,
        "batchSize": 1,
        "responseTimeout": 300,
        "optimization": {"weights_keeper": "all"},
    }
    spec = ArchiveSpec(
        model_name=name,
        handler=str(HANDLERS / "kept_weights_handler.py"),
        serialized_file=scratch / "narrow.pt",
        config_file=write_config(scratch, config),
        version=version,
    )
    write_archive(spec, store, force=True)
    mar = f"{name}-{version}.mar"
    (store / f"{name}.mar").rename(store / mar)
    return mar


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Narrow) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("weights-keeper")
    store = tmp / "store"
    store.mkdir()
    kept = _archive(store, model, "kept", "1.0", WORKERS)
    first = _archive(store, model, "versions", "1.0", 1)
    second = _archive(store, model, "versions", "2.0", 1)
    models = [f"kept={kept}", f"versions={first}", f"versions={second}"]
    with ferry_server(store, models, tmp) as running:
        yield running


def _workers(server: RunningServer, name: str, version: str = "") -> list[dict[str, Any]]:
    path = f"/models/{name}/{version}" if version else f"/models/{name}"
    with server.management() as client:
        described = client.get(path).json()[0]
    workers: list[dict[str, Any]] = described["workers"]
    return workers


def _ready(server: RunningServer, name: str, count: int = WORKERS) -> list[dict[str, Any]]:
    def all_ready() -> bool:
        workers = _workers(server, name)
        return len(workers) == count and all(w["status"] == "READY" for w in workers)

    wait_until(f"{count} workers of {name} ready", all_ready, timeout=120)
    return _workers(server, name)


def _keepers(server: RunningServer) -> set[int]:
    found = set()
    for pid in descendants_of(server.process.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if KEEPER_MODULE.encode() in command:
            found.add(pid)
    return found


def _shared_memory(pid: int) -> set[str]:
    """The inodes of the shared-memory objects the process maps (torch's, for tensors)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[4] for line in lines if "/dev/shm/" in line or "/torch_" in line}


def _keeper_of(server: RunningServer, worker_pid: int) -> int:
    """The keeper whose shared memory the worker maps."""
    mine = _shared_memory(worker_pid)
    (keeper,) = [pid for pid in _keepers(server) if mine & _shared_memory(pid)]
    return keeper


def _predict(server: RunningServer, name: str, **request: Any) -> httpx.Response:
    with server.client() as client:
        return client.post(f"/predictions/{name}", content=json.dumps({"row": ROW, **request}))


def _answer(server: RunningServer, name: str) -> list[float]:
    response = _predict(server, name)
    assert response.status_code == 200, response.text
    output: list[float] = response.json()["output"]
    return output


def _expected(model: Narrow) -> list[float]:
    with torch.no_grad():
        expected: list[float] = model(torch.tensor([ROW]))[0].tolist()
    return expected


def _replaced(server: RunningServer, name: str, old: set[int]) -> list[dict[str, Any]]:
    def done() -> bool:
        workers = _workers(server, name)
        pids = {w["pid"] for w in workers if w["status"] == "READY"}
        return len(pids) == WORKERS and not pids & old

    wait_until(f"the workers of {name} replaced", done, timeout=120)
    return _workers(server, name)


def test_the_workers_import_one_copy_from_one_keeper(server: RunningServer, model: Narrow) -> None:
    workers = _ready(server, "kept")
    keepers = {_keeper_of(server, worker["pid"]) for worker in workers}
    assert len(keepers) == 1
    for worker in workers:
        assert worker["sharedWeights"] > 256 * 512 * 4  # the keeper's buffer, counted once
    for _ in range(2 * WORKERS):
        assert _answer(server, "kept") == pytest.approx(_expected(model), abs=1e-6)


def test_a_killed_workers_replacement_imports_from_the_same_keeper(
    server: RunningServer, model: Narrow
) -> None:
    workers = _ready(server, "kept")
    keeper = _keeper_of(server, workers[0]["pid"])
    os.kill(workers[0]["pid"], signal.SIGKILL)

    def replaced() -> bool:
        pids = {w["pid"] for w in _workers(server, "kept") if w["status"] == "READY"}
        return len(pids) == WORKERS and workers[0]["pid"] not in pids

    wait_until("the killed worker replaced", replaced, timeout=120)
    for worker in _workers(server, "kept"):
        assert _keeper_of(server, worker["pid"]) == keeper
    assert _answer(server, "kept") == pytest.approx(_expected(model), abs=1e-6)


def test_a_killed_keeper_takes_its_workers_along_and_what_they_held_is_answered(
    server: RunningServer, model: Narrow, tmp_path: Path
) -> None:
    workers = _ready(server, "kept")
    keeper = _keeper_of(server, workers[0]["pid"])
    hold = tmp_path / "held"
    answers: list[httpx.Response] = []
    held = threading.Thread(target=lambda: answers.append(_predict(server, "kept", hold=str(hold))))
    held.start()
    wait_until("a worker holds the request", hold.exists, timeout=60)
    os.kill(keeper, signal.SIGKILL)
    held.join(timeout=180)
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    assert answers[0].json()["output"] == pytest.approx(_expected(model), abs=1e-6)
    after = _replaced(server, "kept", {worker["pid"] for worker in workers})
    assert {_keeper_of(server, worker["pid"]) for worker in after} != {keeper}
    assert keeper not in _keepers(server)


def test_a_write_into_the_shared_copy_fails_its_request_and_brings_a_fresh_copy(
    server: RunningServer, model: Narrow
) -> None:
    workers = _ready(server, "kept")
    keeper = _keeper_of(server, workers[0]["pid"])
    response = _predict(server, "kept", write=True)
    assert response.status_code == 500, response.text
    after = _replaced(server, "kept", {worker["pid"] for worker in workers})
    assert {_keeper_of(server, worker["pid"]) for worker in after} != {keeper}
    for _ in range(2 * WORKERS):  # the file's weights, not the doubled ones
        assert _answer(server, "kept") == pytest.approx(_expected(model), abs=1e-6)
    assert "wrote into the weights its model's workers share" in server.log()


def test_each_version_has_its_own_keeper_which_goes_with_its_last_worker(
    server: RunningServer,
) -> None:
    (first,) = _workers(server, "versions", "1.0")
    (second,) = _workers(server, "versions", "2.0")
    assert _keeper_of(server, first["pid"]) != _keeper_of(server, second["pid"])
    keeper = _keeper_of(server, first["pid"])
    with server.management() as client:
        scaled = client.put("/models/versions/1.0", params={"min_worker": 0, "max_worker": 0})
    assert scaled.status_code in (200, 202), scaled.text
    wait_until("version 1.0's keeper gone", lambda: keeper not in _keepers(server), timeout=60)
    assert _keeper_of(server, second["pid"]) in _keepers(server)
