"""CPU workers forked from the fork server (the default): their parent is the fork
server, they draw their own random numbers, a killed one is replaced, a killed fork
server takes its workers along and a new one starts theirs, and with
``--fork-workers false`` they start afresh."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.models import handler_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.server import RunningServer, ferry_server

pytestmark = pytest.mark.integration

WORKERS = 3


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fork-store")
    handler_archive(
        folder, "proc", "process_reporting_handler.py", minWorkers=WORKERS, maxWorkers=WORKERS
    )
    return folder


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    os.environ["FERRY_TEST_MARK"] = "given"
    try:
        folder = tmp_path_factory.mktemp("fork")
        with ferry_server(store, ["proc=proc.mar"], folder) as running:
            yield running
    finally:
        del os.environ["FERRY_TEST_MARK"]


def _workers(server: RunningServer) -> list[dict[str, Any]]:
    with server.management() as client:
        workers: list[dict[str, Any]] = client.get("/models/proc").json()[0]["workers"]
    return workers


def _ready_pids(server: RunningServer) -> set[int]:
    return {w["pid"] for w in _workers(server) if w["status"] == "READY"}


def _answers(server: RunningServer, count: int) -> list[dict[str, Any]]:
    with server.client() as client:
        responses = [client.post("/predictions/proc", content=b"x") for _ in range(count)]
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return [r.json() for r in responses]


def _all_ready(server: RunningServer, without: frozenset[int] = frozenset()) -> set[int]:
    def ready() -> bool:
        pids = _ready_pids(server)
        return len(pids) == WORKERS and not pids & without

    wait_until(f"{WORKERS} workers ready", ready, timeout=120)
    return _ready_pids(server)


def test_workers_are_forked_from_one_fork_server(server: RunningServer) -> None:
    pids = _all_ready(server)
    parents = {
        int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in pids
    }
    assert len(parents) == 1
    (parent,) = parents
    assert parent != server.process.pid
    assert "ferry.worker.forks" in _cmdline(parent)
    answers = _answers(server, 4 * WORKERS)
    assert {a["variable"] for a in answers} == {"given"}  # the worker's environment
    by_worker: dict[int, dict[str, Any]] = {}
    for answer in answers:
        by_worker.setdefault(answer["pid"], answer)
    first_draws = [(a["random"], a["numpy"]) for a in by_worker.values()]
    assert len(set(first_draws)) == len(first_draws)  # each reseeded, not the fork server's


def test_a_killed_forked_worker_is_replaced(server: RunningServer) -> None:
    pids = _all_ready(server)
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    _all_ready(server, without=frozenset({victim}))
    assert len(_answers(server, 2 * WORKERS)) == 2 * WORKERS


def test_a_killed_fork_server_takes_its_workers_and_a_new_one_starts_theirs(
    server: RunningServer,
) -> None:
    pids = _all_ready(server)
    parent = _parent(min(pids))
    os.kill(parent, signal.SIGKILL)
    after = _all_ready(server, without=frozenset(pids))
    new_parent = _parent(min(after))
    assert new_parent != parent and "ferry.worker.forks" in _cmdline(new_parent)
    assert len(_answers(server, 2 * WORKERS)) == 2 * WORKERS


def test_without_forking_workers_start_afresh(store: Path, tmp_path: Path) -> None:
    with ferry_server(store, ["proc=proc.mar"], tmp_path, "--fork-workers", "false") as server:
        pids = _all_ready(server)
        for pid in pids:
            assert "ferry.worker.main" in _cmdline(pid)
            assert _parent(pid) == server.process.pid
