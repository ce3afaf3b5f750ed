"""Which workers are forked, and ``ForkedProcess``: the surface of
``asyncio.subprocess.Process`` the frontend uses, for a worker whose parent is the fork
server (its status comes from there)."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace

import pytest

from ferry.worker_handles.core_allocation import CoreAllocator, CoreClaim
from ferry.worker_handles.fork_server import ForkedProcess
from ferry.worker_handles.process import forkable
from tests.fixtures.fake_worker import spec


def test_its_status_is_what_the_fork_server_reported_and_then_it_cannot_be_signalled() -> None:
    async def scenario() -> None:
        process = ForkedProcess(os.getpid(), asyncio.StreamReader())
        waiting = asyncio.ensure_future(process.wait())
        await asyncio.sleep(0)
        assert not waiting.done() and process.returncode is None
        process.ended(-signal.SIGKILL)
        process.ended(0)  # a second report changes nothing
        assert await waiting == -signal.SIGKILL
        assert await process.wait() == -signal.SIGKILL
        assert process.returncode == -signal.SIGKILL
        with pytest.raises(ProcessLookupError):  # never a pid the kernel may have reused
            process.kill()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_wait_cancelled_leaves_the_status_to_later_waiters() -> None:
    async def scenario() -> None:
        process = ForkedProcess(os.getpid(), asyncio.StreamReader())
        first = asyncio.ensure_future(process.wait())
        await asyncio.sleep(0)
        first.cancel()
        process.ended(3)
        assert await process.wait() == 3

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_only_unpinned_cpu_workers_of_models_without_packages_are_forked() -> None:
    cpu = spec("m")
    assert forkable(cpu, None)
    assert not forkable(replace(cpu, gpu_id=0), None)  # CUDA_VISIBLE_DEVICES: read at start
    cores = CoreAllocator([0, 1])
    claim = CoreClaim(cores, cores.claim(1) or ())
    assert not forkable(cpu, claim)  # OpenMP's binding: read as the library loads
    assert not forkable(spec("m", package_dirs=["/store/m/packages"]), None)
