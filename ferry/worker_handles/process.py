"""The frontend's handle on one worker process: spawn it, send batches, notice when it dies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

from ferry.config.sections import compiles
from ferry.wire.environment import (
    PINNED_BY_FERRY,
    gpu_environment,
    pinned_environment,
    user_pins_threads,
    worker_environment,
)
from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.connection import (
    SpareUnresponsive,
    WorkerConnection,
    raise_start_failure,
)
from ferry.worker_handles.core_allocation import CoreAllocator, CoreClaim
from ferry.worker_handles.fork_server import ForkServer
from ferry.worker_handles.handle import StartFailure, WorkerInfo, WorkerStartFailed
from ferry.worker_handles.output_relay import relay_output
from ferry.worker_handles.spares import SPARE_TAKES_WITHIN, Spare, SpareProcesses
from ferry.worker_handles.spawning import spawn_module

log = logging.getLogger("ferry.worker")


class WorkerProcess(WorkerConnection):
    """One spawned worker and the socket pair that connects it to the frontend; a
    ``WorkerHandle`` (``ferry.worker_handles.handle``)."""

    def __init__(
        self,
        spec: WorkerSpec,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(spec, process.pid, reader, writer)
        self.process = process
        self.cores: CoreClaim | None = None
        """The cores it was pinned to (``start`` with an allocator), released once."""
        self.exited: asyncio.Future[Any] = asyncio.ensure_future(process.wait())
        assert process.stdout is not None
        prefix = f"[{spec.model.model_name} {spec.worker_id} pid {process.pid}]"
        self._output = asyncio.ensure_future(relay_output(process.stdout, prefix))

    @property
    def info(self) -> WorkerInfo:
        return self.worker_info()

    @classmethod
    async def start(
        cls,
        spec: WorkerSpec,
        startup_timeout: float,
        cores: CoreAllocator | None = None,
        spares: SpareProcesses | None = None,
        forks: ForkServer | None = None,
    ) -> WorkerProcess:
        """Spawn the worker, send it its spec, and wait until it has loaded its handler;
        with ``cores``, its torch threads on cores of its own while it lives (when enough
        are free and the user pins nothing); with ``spares``, a model that compiles as it
        loads starts its unpinned workers in a spare process when one is ready, and keeps
        one ready for the next. Raises ``WorkerStartFailed``; the process never outlives
        a failed start."""
        env = process_environment(spec.gpu_id)
        claim = _claim_cores(spec, cores, env)
        if claim is not None:
            env.update(pinned_environment(claim.cores))
        spared = spares is not None and claim is None and compiles(spec.model.model_yaml_config)
        spare = spares.take(spec.gpu_id) if spares is not None and spared else None
        forked = forks if forkable(spec, claim) else None
        try:
            worker = await cls._start(spec, startup_timeout, env, spare, forked)
        except BaseException:
            if claim is not None:
                claim.release()
            raise
        if spares is not None and spared:
            spares.replenish(spec.gpu_id)
        if spare is not None and worker.pid == spare.process.pid:
            log.info(
                "%s worker pid %s started in a spare process (torch's compiler imported)",
                spec.model.model_name,
                worker.pid,
            )
        if claim is not None:
            worker.hold(claim)
            log.info(
                "%s worker pid %s pinned to cores %s",
                spec.model.model_name,
                worker.pid,
                claim.cores,
            )
        return worker

    def hold(self, claim: CoreClaim) -> None:
        """Keep ``claim`` while this process lives: given back when it is killed or exits."""
        self.cores = claim
        self.exited.add_done_callback(lambda _: claim.release())

    @classmethod
    async def _start(
        cls,
        spec: WorkerSpec,
        startup_timeout: float,
        env: dict[str, str],
        spare: Spare | None,
        forks: ForkServer | None = None,
    ) -> WorkerProcess:
        if spare is not None:
            await spare.hand_over()
            try:
                return await cls._connect(
                    spec, startup_timeout, spare.process, spare.parent_sock, SPARE_TAKES_WITHIN
                )
            except SpareUnresponsive as exc:
                log.warning(
                    "%s worker %s: spare process pid %s did not take its work (%s); killed, "
                    "and the worker started in a new process",
                    spec.model.model_name,
                    spec.worker_id,
                    spare.process.pid,
                    exc,
                )
        if forks is not None:
            process, parent_sock = await _forked(forks, env)
        else:
            process, parent_sock = await _spawned(env)
        return await cls._connect(spec, startup_timeout, process, parent_sock, None)

    @classmethod
    async def _connect(
        cls,
        spec: WorkerSpec,
        startup_timeout: float,
        process: asyncio.subprocess.Process,
        parent_sock: socket.socket,
        taken_within: float | None,
    ) -> WorkerProcess:
        """The worker once its handler has loaded; the process is killed if it fails."""
        worker: WorkerProcess | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
            worker = cls(spec, process, reader, writer)
            await asyncio.wait_for(worker._handshake(spec, taken_within), startup_timeout)
        except BaseException as exc:
            if worker is not None:
                worker.kill()
            else:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                parent_sock.close()
            if isinstance(exc, SpareUnresponsive):
                raise
            raise_start_failure(exc)
        return worker

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self._writer.close()
        if self.cores is not None:
            self.cores.release()  # for the replacement, which starts before this one is reaped


def forkable(spec: WorkerSpec, claim: CoreClaim | None) -> bool:
    """Whether the fork server may start this worker: an unpinned CPU worker, whose
    environment is the fork server's own, of a model without packages of its own (those
    go first on its import path, and the fork server has already imported its own numpy,
    PIL, yaml...: a model pinning another version must import it afresh)."""
    return claim is None and spec.gpu_id is None and not spec.model.package_dirs


def _claim_cores(
    spec: WorkerSpec, cores: CoreAllocator | None, env: dict[str, str]
) -> CoreClaim | None:
    """Cores of its own for the worker, when pinning is on and the user pins nothing."""
    if cores is None or user_pins_threads(env):
        return None
    claimed = cores.claim(spec.torch_threads)
    if claimed is None:
        log.warning(
            "%s worker %s runs unpinned: fewer than %d cores are free of the server's other "
            "workers (cpu_pinning gives each worker cores of its own)",
            spec.model.model_name,
            spec.worker_id,
            spec.torch_threads,
        )
        return None
    return CoreClaim(cores, claimed)


def process_environment(gpu_id: int | None) -> dict[str, str]:
    """The environment a worker process (or a host of several models) starts with, bound
    to ``gpu_id`` when it has one."""
    env = worker_environment(os.environ)
    env.pop(PINNED_BY_FERRY, None)  # only for a worker Ferry pins: not inherited
    if gpu_id is not None:
        env.update(gpu_environment(gpu_id, os.environ))
    return env


async def _spawned(
    env: dict[str, str], *args: str
) -> tuple[asyncio.subprocess.Process, socket.socket]:
    """A worker process and the frontend's end of its socket; raises ``WorkerStartFailed``."""
    parent_sock, child_sock = socket.socketpair()
    try:
        process = await _spawn(child_sock, env, *args)
    except OSError as exc:
        parent_sock.close()
        raise WorkerStartFailed(
            StartFailure.SPAWN, f"cannot start a worker process: {exc}"
        ) from exc
    except BaseException:  # cancelled (a spare's spawn at shutdown)
        parent_sock.close()
        raise
    finally:
        child_sock.close()
    return process, parent_sock


async def _forked(forks: ForkServer, env: dict[str, str]) -> tuple[Any, socket.socket]:
    """A worker forked by the fork server; raises ``WorkerStartFailed``."""
    try:
        return await forks.spawn(env)
    except (TimeoutError, OSError, ValueError) as exc:
        raise WorkerStartFailed(
            StartFailure.SPAWN, f"the fork server could not start a worker: {exc}"
        ) from exc


async def _spawn(
    child_sock: socket.socket, env: dict[str, str], *args: str
) -> asyncio.subprocess.Process:
    return await spawn_module("ferry.worker.main", child_sock, env, *args)


async def spawn_spare(gpu_id: int | None) -> Spare:
    """A spare worker process (``ferry.worker_handles.spares``) bound to ``gpu_id``."""
    process, parent_sock = await _spawned(process_environment(gpu_id), "--preload-compiler")
    assert process.stdout is not None
    relay = asyncio.ensure_future(relay_output(process.stdout, f"[spare pid {process.pid}]"))
    return Spare(process, parent_sock, relay)
