"""Spare worker processes (``ferry.worker_handles.spares``) with a fake spawner: one per
GPU, taken once and only when started and alive, never two started for one GPU, all
stopped at close; which workers take one: those of a compiling model, unpinned; and the
setting that turns them off."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any

import pytest

from ferry.apis import Apis
from ferry.config.sources import load_settings
from ferry.worker_handles import process as worker_process
from ferry.worker_handles.spares import Spare, SpareProcesses
from tests.fixtures.fake_worker import spec

BOUND = 30


class FakeProcess:
    """A process that exits when killed or when the test calls ``exit``."""

    pid = 4242

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.killed = False
        self._exited = asyncio.Event()

    def kill(self) -> None:
        self.killed = True
        self.exit(-9)

    def exit(self, status: int) -> None:
        self.returncode = status
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode


class Spawner:
    """Spawns fake spares; ``gate`` holds each spawn until set; ``discard_all`` closes
    their sockets at a test's end."""

    def __init__(self) -> None:
        self.spawned: list[tuple[int | None, Spare]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, gpu_id: int | None) -> Spare:
        await self.gate.wait()
        parent, child = socket.socketpair()
        child.close()
        spare = Spare(FakeProcess(), parent)  # type: ignore[arg-type]
        self.spawned.append((gpu_id, spare))
        return spare

    def discard_all(self) -> None:
        for _, spare in self.spawned:
            spare.discard()


async def _settled() -> None:
    for _ in range(5):  # the spawn task's steps
        await asyncio.sleep(0)


def test_a_spare_is_taken_once_per_gpu_after_it_started() -> None:
    async def scenario() -> None:
        spawner = Spawner()
        spares = SpareProcesses(spawner)
        assert spares.take(None) is None  # none asked for yet
        spares.replenish(None)
        spares.replenish(None)  # one is there already: no second
        spares.replenish(0)
        await _settled()
        assert [gpu for gpu, _ in spawner.spawned] == [None, 0]
        taken = spares.take(None)
        assert taken is spawner.spawned[0][1]
        assert spares.take(None) is None  # taken once
        assert spares.take(0) is spawner.spawned[1][1]
        spawner.discard_all()

    asyncio.run(asyncio.wait_for(scenario(), BOUND))


def test_a_spare_still_starting_stays_for_the_next_worker() -> None:
    async def scenario() -> None:
        spawner = Spawner()
        spawner.gate.clear()
        spares = SpareProcesses(spawner)
        spares.replenish(None)
        await _settled()
        assert spares.take(None) is None  # still spawning: this worker spawns its own
        spawner.gate.set()
        await _settled()
        assert spares.take(None) is spawner.spawned[0][1]
        spawner.discard_all()

    asyncio.run(asyncio.wait_for(scenario(), BOUND))


def test_a_spare_that_died_waiting_is_discarded_not_used() -> None:
    async def scenario() -> None:
        spawner = Spawner()
        spares = SpareProcesses(spawner)
        spares.replenish(None)
        await _settled()
        ((_, spare),) = spawner.spawned
        spare.process.exit(1)  # type: ignore[attr-defined]
        assert spares.take(None) is None
        assert spare.parent_sock.fileno() == -1  # closed

    asyncio.run(asyncio.wait_for(scenario(), BOUND))


def test_a_spare_that_dies_before_it_is_taken_is_logged_and_a_taken_one_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 47: a spare's death was silent."""

    async def scenario() -> None:
        spawner = Spawner()
        spares = SpareProcesses(spawner)
        spares.replenish(None)
        spares.replenish(0)
        await _settled()
        (_, idle), (_, taken) = spawner.spawned
        assert spares.take(0) is taken
        idle.process.exit(-9)  # type: ignore[attr-defined]
        taken.process.exit(0)  # type: ignore[attr-defined]  # a worker's exit, not a spare's
        await _settled()
        spawner.discard_all()

    with caplog.at_level("WARNING", logger="ferry.workers"):
        asyncio.run(asyncio.wait_for(scenario(), BOUND))
    deaths = [r.getMessage() for r in caplog.records if "before a worker took it" in r.getMessage()]
    assert deaths == [
        "spare worker process pid 4242 (CPU) exited with status -9 before a worker took it; "
        "the next worker of a compiled model starts in a new process"
    ]


def test_a_spare_that_could_not_start_is_not_used() -> None:
    async def failing(gpu_id: int | None) -> Spare:
        raise OSError("fork failed")

    async def scenario() -> None:
        spares = SpareProcesses(failing)
        spares.replenish(None)
        await _settled()
        assert spares.take(None) is None

    asyncio.run(asyncio.wait_for(scenario(), BOUND))


def test_close_stops_every_spare_started_or_starting() -> None:
    async def scenario() -> None:
        spawner = Spawner()
        spares = SpareProcesses(spawner)
        spares.replenish(None)
        await _settled()
        spawner.gate.clear()
        spares.replenish(0)  # still starting at close
        await spares.close()
        ((_, started),) = spawner.spawned
        assert started.process.killed  # type: ignore[attr-defined]
        assert spares.take(None) is None and spares.take(0) is None

    asyncio.run(asyncio.wait_for(scenario(), BOUND))


class Started(Exception):
    """Raised by the fake start: the test only checks what it was given."""


@pytest.mark.parametrize(
    ("config", "pinned", "takes"),
    [
        ({"optimization": {"compile": "default"}}, False, True),
        ({"pt2": "inductor"}, False, True),
        ({}, False, False),  # nothing to compile: no spare
        ({"optimization": {"compile": "default"}}, True, False),  # pinned: its own process
    ],
)
def test_only_unpinned_workers_of_compiling_models_take_a_spare(
    monkeypatch: pytest.MonkeyPatch, config: dict[str, Any], pinned: bool, takes: bool
) -> None:
    given: list[Any] = []

    async def fake_start(
        cls: Any, spec: Any, timeout: float, env: Any, spare: Any, forks: Any = None
    ) -> Any:
        given.append(spare)
        raise Started

    monkeypatch.setattr(worker_process.WorkerProcess, "_start", classmethod(fake_start))
    if pinned:
        claim = SimpleNamespace(cores=(0,), release=lambda: None)
        monkeypatch.setattr(worker_process, "_claim_cores", lambda spec, cores, env: claim)
        monkeypatch.setattr(worker_process, "pinned_environment", lambda cores: {})

    async def scenario() -> None:
        spawner = Spawner()
        spares = SpareProcesses(spawner)
        spares.replenish(None)
        await _settled()
        with pytest.raises(Started):
            compiling = spec(model_yaml_config=config)
            await worker_process.WorkerProcess.start(compiling, 60, None, spares)
        assert (given[0] is not None) is takes
        spawner.discard_all()

    asyncio.run(asyncio.wait_for(scenario(), BOUND))


@pytest.mark.parametrize(
    ("properties", "in_process", "kept"),
    [
        ({}, False, True),  # on by default
        ({"spare_worker_for_compiled_models": "false"}, False, False),
        ({}, True, False),  # workers on threads: no processes to spare
    ],
)
def test_the_setting_decides_whether_the_server_keeps_spares(
    properties: dict[str, str], in_process: bool, kept: bool
) -> None:
    settings = load_settings(properties, {}, None)
    apis = Apis.local(settings, cores=1, in_process=in_process)
    try:
        assert (apis.spares is not None) is kept
    finally:
        asyncio.run(asyncio.wait_for(apis.close(), BOUND))
