"""Handing cores to workers, and the environment that binds a worker's threads to them."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterator
from typing import cast

import pytest

from ferry.wire.environment import PINNED_BY_FERRY, pinned_environment, user_pins_threads
from ferry.wire.spec import HandlerSpec, WorkerSpec
from ferry.worker import pinned_cores
from ferry.worker.pinned_cores import forget_pinning
from ferry.worker_handles import process
from ferry.worker_handles.core_allocation import CoreAllocator, CoreClaim
from ferry.worker_handles.process import WorkerProcess


@pytest.fixture(autouse=True)
def unpinned_afterwards() -> Iterator[None]:
    """``forget_pinning`` remembers the worker's cores for the process: not past a test."""
    yield
    pinned_cores._worker_cores = None


def test_no_two_live_workers_hold_a_core_and_released_cores_are_handed_out_again() -> None:
    cores = CoreAllocator([3, 1, 2, 0])
    first = cores.claim(2)
    second = cores.claim(2)
    assert first == (0, 1) and second == (2, 3)
    assert cores.claim(1) is None  # none free: that worker runs unpinned
    cores.release(first or ())
    assert cores.claim(1) == (0,)
    assert cores.claim(2) is None  # one free, two asked for
    assert cores.claim(0) is None


def test_the_environment_binds_one_thread_per_core() -> None:
    assert pinned_environment((4, 5, 6)) == {
        "OMP_PLACES": "{4},{5},{6}",
        "OMP_PROC_BIND": "close",
        PINNED_BY_FERRY: "4,5,6",
    }


def test_a_user_who_pins_threads_is_left_alone() -> None:
    assert not user_pins_threads({"OMP_NUM_THREADS": "2", "OMP_PROC_BIND": ""})
    for name in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"):
        assert user_pins_threads({name: "x"})


def test_a_pinned_worker_drops_the_binding_but_not_the_users_variables() -> None:
    pinned = {**pinned_environment((1,)), "OMP_NUM_THREADS": "1"}
    assert forget_pinning(pinned) == (1,)
    assert pinned == {"OMP_NUM_THREADS": "1"}
    users_own = {"OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"}
    assert forget_pinning(users_own) is None  # Ferry did not pin: nothing of theirs goes
    assert users_own == {"OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"}


def test_a_pinned_workers_own_threads_may_use_all_its_cores() -> None:
    every = tuple(sorted(os.sched_getaffinity(0)))
    environ = pinned_environment(every)
    assert forget_pinning(environ) == every
    seen: list[set[int]] = []

    def stage_thread() -> None:
        os.sched_setaffinity(0, every[:1])  # as if started by a thread bound to one core
        pinned_cores.spread_over_worker_cores()
        seen.append(os.sched_getaffinity(0))

    thread = threading.Thread(target=stage_thread)
    thread.start()
    thread.join()
    assert seen == [set(every)]


def test_a_claim_is_given_back_once() -> None:
    """Kill and exit both give a worker's cores back: the second must not free the cores
    a replacement claimed in between."""
    cores = CoreAllocator([0, 1])
    claim = CoreClaim(cores, cores.claim(2) or ())
    claim.release()
    replacement = cores.claim(2)
    claim.release()
    assert replacement == (0, 1) and cores.claim(1) is None


class UnreapedProcess:
    """A killed process that the event loop has not reaped yet (``wait`` still pending)."""

    pid = 4242

    def __init__(self) -> None:
        self.stdout = asyncio.StreamReader()
        self.reaped = asyncio.Event()
        self.killed = False

    async def wait(self) -> int:
        await self.reaped.wait()
        return -9

    def kill(self) -> None:
        self.killed = True


class ClosedWriter:
    def close(self) -> None:
        pass


def spec(threads: int) -> WorkerSpec:
    return WorkerSpec(HandlerSpec("m", "/models/m", "h.py:fn", {}, 8, {}), None, threads, "w0.1")


def test_a_killed_worker_leaves_its_cores_to_a_replacement_started_at_once() -> None:
    """A recycled or hung worker is killed and its replacement started with no await in
    between: the cores must be free then, not when the old process is reaped."""

    async def scenario() -> None:
        cores = CoreAllocator([0, 1])
        old = UnreapedProcess()
        worker = WorkerProcess(
            spec(2),
            cast(asyncio.subprocess.Process, old),
            asyncio.StreamReader(),
            cast(asyncio.StreamWriter, ClosedWriter()),
        )
        worker.hold(CoreClaim(cores, cores.claim(2) or ()))
        worker.kill()
        assert old.killed
        replacement = cores.claim(2)
        old.reaped.set()
        old.stdout.feed_eof()
        await worker.exited
        assert replacement == (0, 1)
        assert cores.claim(1) is None  # the old one's exit freed nothing of the replacement's

    asyncio.run(scenario())


def test_a_worker_that_finds_too_few_free_cores_runs_unpinned_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cores = CoreAllocator([0, 1])
    first = process._claim_cores(spec(2), cores, {})
    with caplog.at_level(logging.WARNING, logger=process.log.name):
        second = process._claim_cores(spec(2), cores, {})
    assert first is not None and first.cores == (0, 1)
    assert second is None
    assert "m worker w0.1 runs unpinned: fewer than 2 cores are free" in caplog.text
    assert process._claim_cores(spec(1), cores, {"OMP_PROC_BIND": "true"}) is None
