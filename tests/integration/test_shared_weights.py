"""One copy of a model's weights on a real server: a TorchScript model's three workers map
one weights file, answer as the model does, report the copy apart (counted once), a
killed worker's replacement maps the same file, and ``share_weights: false`` turns it off."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import HANDLERS, save_torchscript, write_config
from tests.fixtures.polling import wait_until
from tests.fixtures.server import RunningServer, ferry_server

pytestmark = pytest.mark.integration

WORKERS = 3
ROW = [float(i % 7) / 7 for i in range(512)]


class Wide(nn.Module):
    """About 4 MB of weights: large beside what a worker's load allocates on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(512, 1024)
        self.second = nn.Linear(1024, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.second(torch.relu(self.first(x)))
        return out[:, :4]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Wide:
    torch.manual_seed(0)
    return Wide().eval()


def _archive(store: Path, model: Wide, name: str, **optimization: object) -> None:
    scratch = store.parent / f"{name}-src"
    scratch.mkdir(parents=True)
    save_torchscript(model, scratch / "wide.pt")
    config: dict[str, Any] = {"minWorkers": WORKERS, "maxWorkers": WORKERS, "batchSize": 1}
    if optimization:
        config["optimization"] = optimization
    spec = ArchiveSpec(
        model_name=name,
        handler=str(HANDLERS / "weights_reporting_handler.py"),
        serialized_file=scratch / "wide.pt",
        config_file=write_config(scratch, config),
    )
    write_archive(spec, store, force=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Wide) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("shared-weights")
    store = tmp / "store"
    store.mkdir()
    _archive(store, model, "shared")
    _archive(store, model, "private", share_weights=False)
    with ferry_server(store, ["shared=shared.mar", "private=private.mar"], tmp) as running:
        yield running


def _workers(server: RunningServer, name: str) -> list[dict[str, Any]]:
    with server.management() as client:
        described = client.get(f"/models/{name}").json()[0]
    workers: list[dict[str, Any]] = described["workers"]
    return workers


def _ready(server: RunningServer, name: str) -> list[dict[str, Any]]:
    def all_ready() -> bool:
        workers = _workers(server, name)
        return len(workers) == WORKERS and all(w["status"] == "READY" for w in workers)

    wait_until(f"{WORKERS} workers of {name} ready", all_ready, timeout=120)
    return _workers(server, name)


def _mapped_weights(pid: int) -> set[str]:
    """The shared weights files the process maps."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[-1] for line in lines if line.endswith("/weights.pt")}


def _answer(server: RunningServer, name: str) -> dict[str, Any]:
    with server.client() as client:
        response = client.post(f"/predictions/{name}", content=json.dumps(ROW))
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_the_workers_map_one_file_and_answer_as_the_model(
    server: RunningServer, model: Wide
) -> None:
    workers = _ready(server, "shared")
    files = [_mapped_weights(worker["pid"]) for worker in workers]
    assert len(files[0]) == 1 and files[0] == files[1] == files[2]
    (weights,) = files[0]
    size = os.path.getsize(weights)
    assert size > 4_000_000
    for worker in workers:
        assert worker["sharedWeights"] == size
        assert worker["modelMemory"] < size  # the copy is not its own
    with torch.no_grad():
        expected = model(torch.tensor([ROW]))[0].tolist()
    for _ in range(2 * WORKERS):
        assert _answer(server, "shared")["output"] == pytest.approx(expected, abs=1e-6)


def test_a_killed_worker_comes_back_on_the_same_copy(server: RunningServer) -> None:
    before = _ready(server, "shared")
    (weights,) = _mapped_weights(before[0]["pid"])
    expected = _answer(server, "shared")["output"]
    os.kill(before[0]["pid"], signal.SIGKILL)

    def replaced() -> bool:
        pids = {w["pid"] for w in _workers(server, "shared") if w["status"] == "READY"}
        return len(pids) == WORKERS and before[0]["pid"] not in pids

    wait_until("the killed worker replaced", replaced, timeout=120)
    for worker in _workers(server, "shared"):
        assert _mapped_weights(worker["pid"]) == {weights}
    for _ in range(2 * WORKERS):
        assert _answer(server, "shared")["output"] == expected


def test_share_weights_false_gives_each_worker_its_own_copy(server: RunningServer) -> None:
    workers = _ready(server, "private")
    for worker in workers:
        assert worker["sharedWeights"] == 0
        assert _mapped_weights(worker["pid"]) == set()
    assert _answer(server, "private")["output"] == _answer(server, "shared")["output"]
