"""Worker processes that host several models (``ferry.worker.host``), and the handle on
each model they host.

Models of one process group (``WorkerSpec.process_group``) share processes: a host holds
at most one worker of each model version, so a model with two workers has them in two
hosts, and a host is started when no live one of the group (on the same GPU) has room.
A host ends once it hosts nothing.

Isolation, as the README's "Many models on one machine" describes it: a handler that
raises fails its own requests only, as anywhere. A worker whose batch times out (a hung
handler) cannot be stopped on its own, so its host is killed, and with it every model it
held: their slots start them again (in a new host) and retry what they held once. A
crash (a segfault, an ``os._exit``, a GPU fault) takes the host down the same way; a lone
request is blamed for it only when no other model of the host was running a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from ferry.wire.messages import HOST_READY, MODEL_SOCKET
from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.connection import (
    WorkerConnection,
    raise_start_failure,
    start_failure,
)
from ferry.worker_handles.handle import (
    StartFailure,
    WorkerFactory,
    WorkerHandle,
    WorkerInfo,
    WorkerStartFailed,
)
from ferry.worker_handles.output_relay import relay_output
from ferry.worker_handles.process import process_environment
from ferry.worker_handles.spawning import spawn_module

log = logging.getLogger("ferry.worker")

HostKey = tuple[str, int | None]
"""A process group and the GPU its hosts are bound to."""


class HostedWorker(WorkerConnection):
    """One model version's worker inside a host; a ``WorkerHandle``."""

    def __init__(
        self,
        spec: WorkerSpec,
        host: HostProcess,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(spec, host.pid, reader, writer)
        self.host = host
        self.exited: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        """Done when it is unloaded (0) or its host exits (see ``HostProcess``)."""
        self.loaded = False

    @property
    def info(self) -> WorkerInfo:
        return self.worker_info(shared_process=True)

    def disconnect(self) -> None:
        self._writer.close()

    def kill(self) -> None:
        """Unload the model; with a batch (or its load) still running, which no thread can
        be made to drop, the whole host goes."""
        self.disconnect()
        if self.exited.done():
            return
        if self.batches_held > 0 or not self.loaded:
            log.warning(
                "killing host pid %s (process group %r) and the %d models it holds: "
                "%s worker %s cannot be stopped on its own",
                self.pid,
                self.host.key[0],
                len(self.host.members),
                self.spec.model.model_name,
                self.spec.worker_id,
            )
            self.host.kill()
            return
        self.exited.set_result(0)
        self.host.release(self)


class HostProcess:
    """One host process: its control socket, and the models it holds."""

    def __init__(
        self, key: HostKey, index: int, process: asyncio.subprocess.Process, control: socket.socket
    ) -> None:
        self.key, self.index = key, index
        self.process = process
        self.pid = process.pid
        self.control = control
        self.members: set[HostedWorker] = set()
        self.places: set[tuple[str, str]] = set()
        """The model versions (name, folder) it holds or is loading: one worker of each."""
        self.closing = False
        self._loading = asyncio.Lock()
        """One load at a time, as the host runs them: a model's start-up timeout counts
        its own load, not the loads queued before it."""
        self.exited: asyncio.Future[Any] = asyncio.ensure_future(process.wait())
        self.exited.add_done_callback(self._on_exit)
        assert process.stdout is not None
        prefix = f"[host {key[0]}#{index} pid {process.pid}]"
        self._output = asyncio.ensure_future(relay_output(process.stdout, prefix))

    @classmethod
    async def spawn(cls, key: HostKey, index: int, threads: int, timeout: float) -> HostProcess:
        """A new host, once it has torch imported; raises ``WorkerStartFailed``."""
        env = process_environment(key[1])
        parent, child = socket.socketpair()
        try:
            process = await spawn_module("ferry.worker.host", child, env, "--threads", str(threads))
        except OSError as exc:
            parent.close()
            raise WorkerStartFailed(StartFailure.SPAWN, f"cannot start a host: {exc}") from exc
        finally:
            child.close()
        parent.setblocking(False)
        host = cls(key, index, process, parent)
        try:
            ready = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(parent, 1), timeout)
        except BaseException as exc:
            host.kill()
            raise start_failure(exc) from exc
        if ready != HOST_READY:
            host.kill()
            raise WorkerStartFailed(StartFailure.EXITED, "the host process exited while starting")
        log.info("host %s#%d started (pid %s)", key[0], index, host.pid)
        return host

    def has_room_for(self, spec: WorkerSpec) -> bool:
        return not self.closing and not self.exited.done() and _place(spec) not in self.places

    async def load(self, spec: WorkerSpec, timeout: float) -> HostedWorker:
        """Host a worker for ``spec`` (its place taken already), once the loads before it
        are done; raises ``WorkerStartFailed``."""
        async with self._loading:
            if self.exited.done():
                raise WorkerStartFailed(StartFailure.EXITED, "the host process is gone")
            return await self._load(spec, timeout)

    async def _load(self, spec: WorkerSpec, timeout: float) -> HostedWorker:
        ours, theirs = socket.socketpair()
        try:
            socket.send_fds(self.control, [MODEL_SOCKET], [theirs.fileno()])
        except OSError as exc:
            ours.close()
            raise WorkerStartFailed(StartFailure.EXITED, "the host process is gone") from exc
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        worker = HostedWorker(spec, self, reader, writer)
        self.members.add(worker)
        try:
            await asyncio.wait_for(worker._handshake(spec), timeout)
        except BaseException as exc:
            failure = start_failure(exc)
            if isinstance(failure, WorkerStartFailed) and failure.kind.load_ended:
                worker.loaded = True  # its thread has ended: closing lets it go
            if isinstance(exc, asyncio.CancelledError):
                # Not wanted any more (scaled away, unregistered): its thread finishes the
                # load, finds the socket closed and ends; the neighbours serve on.
                worker.loaded = True
            worker.kill()
            raise_start_failure(exc)
        worker.loaded = True
        return worker

    def release(self, worker: HostedWorker) -> None:
        """``worker`` is unloaded: its place is free, and an empty host ends."""
        self.members.discard(worker)
        self.places.discard(_place(worker.spec))
        self.close_if_empty()

    def close_if_empty(self) -> None:
        if not self.places and not self.closing:
            self.closing = True
            self.control.close()  # the host exits once its last model thread is done

    def kill(self) -> None:
        self.closing = True
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def _on_exit(self, exited: asyncio.Future[Any]) -> None:
        self.closing = True
        self.control.close()
        status = exited.result() if not exited.cancelled() else None
        busy = [member for member in self.members if member.batches_held > 0]
        for member in self.members:
            member.disconnect()
            if not member.exited.done():
                member.exited.set_result(_status_for(member, busy, status))
        self.members.clear()
        self.places.clear()


def _status_for(member: HostedWorker, busy: list[HostedWorker], status: object) -> object:
    """The exit status ``member`` reports for its host's: as it is when ``member`` was the
    only one running a batch (its batch may be the cause); else as if killed from outside,
    so that its requests are retried rather than blamed for a neighbour's crash."""
    if busy == [member]:
        return status
    return -signal.SIGKILL


def _place(spec: WorkerSpec) -> tuple[str, str]:
    return spec.model.model_name, spec.model.model_dir


HostSpawner = Callable[[HostKey, int, int, float], Awaitable[HostProcess]]


class ProcessHosts:
    """The live hosts of every process group; starts hosted workers."""

    def __init__(self, spawn: HostSpawner = HostProcess.spawn) -> None:
        self._spawn = spawn
        self._hosts: dict[HostKey, list[HostProcess]] = {}
        self._locks: dict[HostKey, asyncio.Lock] = {}
        self._started = 0

    def processes(self) -> list[HostProcess]:
        return [host for hosts in self._hosts.values() for host in hosts if not host.exited.done()]

    async def start(self, spec: WorkerSpec, startup_timeout: float) -> HostedWorker:
        """A worker for ``spec`` in a host of its group with room, started when none has."""
        key: HostKey = (spec.process_group, spec.gpu_id)
        async with self._locks.setdefault(key, asyncio.Lock()):
            live = [host for host in self._hosts.get(key, []) if not host.exited.done()]
            host = next((h for h in live if h.has_room_for(spec)), None)
            if host is None:
                self._started += 1
                host = await self._spawn(key, self._started, spec.torch_threads, startup_timeout)
                live.append(host)
            self._hosts[key] = live
            host.places.add(_place(spec))
        try:
            return await host.load(spec, startup_timeout)
        except BaseException:
            host.places.discard(_place(spec))
            host.close_if_empty()
            raise


def sharing_processes(own: WorkerFactory, hosts: ProcessHosts) -> WorkerFactory:
    """Workers of specs that name a process group in ``hosts``, the others by ``own``. A
    model whose load a shared process did not survive (it crashed or hung while loading)
    gets processes of its own from then on: retrying it there would take its neighbours
    down at every attempt."""
    isolated: set[tuple[str, str]] = set()

    async def start(spec: WorkerSpec, startup_timeout: float) -> WorkerHandle:
        if not spec.process_group or _place(spec) in isolated:
            return await own(spec, startup_timeout)
        try:
            return await hosts.start(spec, startup_timeout)
        except WorkerStartFailed as failure:
            if failure.kind in (StartFailure.EXITED, StartFailure.TIMEOUT):
                isolated.add(_place(spec))
                log.warning(
                    "%s: its shared process did not survive its load (%s); it gets a process "
                    "of its own from now on",
                    spec.model.model_name,
                    failure.message,
                )
            raise

    return start
