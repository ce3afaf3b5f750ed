"""The frontend's handle on one worker process: spawn it, send batches, notice when it dies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from typing import Any

from ferry.wire import codec
from ferry.wire.environment import (
    PINNED_BY_FERRY,
    gpu_environment,
    pinned_environment,
    user_pins_threads,
    worker_environment,
)
from ferry.wire.messages import (
    BatchResult,
    CancelRequests,
    Message,
    PartialResult,
    PredictBatch,
    StartWorker,
    WorkerLoadFailed,
    WorkerReady,
)
from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.core_allocation import CoreAllocator, CoreClaim
from ferry.worker_handles.handle import StartFailure, WorkerGone, WorkerInfo, WorkerStartFailed
from ferry.worker_handles.output_relay import relay_output

log = logging.getLogger("ferry.worker")


class WorkerProcess:
    """One spawned worker and the socket pair that connects it to the frontend; a
    ``WorkerHandle`` (``ferry.worker_handles.handle``)."""

    def __init__(
        self,
        spec: WorkerSpec,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.spec = spec
        self.process = process
        self._reader = reader
        self._writer = writer
        self.pid = process.pid
        self.device = "unknown"
        self.cores: CoreClaim | None = None
        """The cores it was pinned to (``start`` with an allocator), released once."""
        self.exited: asyncio.Future[Any] = asyncio.ensure_future(process.wait())
        assert process.stdout is not None
        prefix = f"[{spec.model_name} {spec.worker_id} pid {process.pid}]"
        self._output = asyncio.ensure_future(relay_output(process.stdout, prefix))

    @property
    def info(self) -> WorkerInfo:
        return WorkerInfo(self.pid, self.device)

    @classmethod
    async def start(
        cls, spec: WorkerSpec, startup_timeout: float, cores: CoreAllocator | None = None
    ) -> WorkerProcess:
        """Spawn the worker, send it its spec, and wait until it has loaded its handler;
        with ``cores``, its torch threads on cores of its own while it lives (when enough
        are free and the user pins nothing). Raises ``WorkerStartFailed``; the process
        never outlives a failed start."""
        env = worker_environment(os.environ)
        env.pop(PINNED_BY_FERRY, None)  # only for a worker Ferry pins: not inherited
        if spec.gpu_id is not None:
            env.update(gpu_environment(spec.gpu_id, os.environ))
        claim = _claim_cores(spec, cores, env)
        if claim is not None:
            env.update(pinned_environment(claim.cores))
        try:
            worker = await cls._start(spec, startup_timeout, env)
        except BaseException:
            if claim is not None:
                claim.release()
            raise
        if claim is not None:
            worker.hold(claim)
            log.info(
                "%s worker pid %s pinned to cores %s", spec.model_name, worker.pid, claim.cores
            )
        return worker

    def hold(self, claim: CoreClaim) -> None:
        """Keep ``claim`` while this process lives: given back when it is killed or exits."""
        self.cores = claim
        self.exited.add_done_callback(lambda _: claim.release())

    @classmethod
    async def _start(
        cls, spec: WorkerSpec, startup_timeout: float, env: dict[str, str]
    ) -> WorkerProcess:
        parent_sock, child_sock = socket.socketpair()
        try:
            process = await _spawn(child_sock, env)
        except OSError as exc:
            parent_sock.close()
            raise WorkerStartFailed(
                StartFailure.SPAWN, f"cannot start a worker process: {exc}"
            ) from exc
        finally:
            child_sock.close()
        worker: WorkerProcess | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
            worker = cls(spec, process, reader, writer)
            await asyncio.wait_for(worker._handshake(spec), startup_timeout)
        except BaseException as exc:
            if worker is not None:
                worker.kill()
            else:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                parent_sock.close()
            failure = _start_failure(exc)
            if failure is exc:
                raise
            raise failure from exc
        return worker

    async def _handshake(self, spec: WorkerSpec) -> None:
        self._writer.write(codec.encode(StartWorker(spec.to_dict())))
        await self._writer.drain()
        message = await self._receive()
        if isinstance(message, WorkerLoadFailed):
            raise WorkerStartFailed(StartFailure.LOAD_ERROR, message.message)
        if not isinstance(message, WorkerReady):
            raise codec.ProtocolError(f"unexpected first message {type(message).__name__}")
        self.device = message.device

    async def _receive(self) -> Message:
        try:
            header = await self._reader.readexactly(codec.FRAME_HEADER.size)
            payload = await self._reader.readexactly(codec.frame_length(header))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise WorkerGone(f"worker {self.pid} closed its connection") from exc
        return codec.decode(payload)

    async def send(self, batch: PredictBatch) -> None:
        if self._writer.is_closing():
            raise WorkerGone(f"worker {self.pid} is gone")
        self._writer.write(codec.encode(batch))
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise WorkerGone(f"worker {self.pid} is gone") from exc

    async def receive(self) -> BatchResult | PartialResult:
        message = await self._receive()
        if not isinstance(message, BatchResult | PartialResult):
            raise codec.ProtocolError(f"worker {self.pid} sent {type(message).__name__}")
        return message

    def cancel(self, batch_id: int, request_ids: list[str]) -> None:
        if not self._writer.is_closing():  # a few bytes: written without waiting
            self._writer.write(codec.encode(CancelRequests(batch_id, request_ids)))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self._writer.close()
        if self.cores is not None:
            self.cores.release()  # for the replacement, which starts before this one is reaped


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
            spec.model_name,
            spec.worker_id,
            spec.torch_threads,
        )
        return None
    return CoreClaim(cores, claimed)


async def _spawn(child_sock: socket.socket, env: dict[str, str]) -> asyncio.subprocess.Process:
    # -P: the frontend's working directory is not put on the worker's import path, so a
    # stray ``image_classifier.py`` there cannot replace a built-in handler.
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-P",
        "-m",
        "ferry.worker.main",
        "--fd",
        str(child_sock.fileno()),
        pass_fds=(child_sock.fileno(),),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )


def _start_failure(exc: BaseException) -> BaseException:
    """The ``WorkerStartFailed`` that explains ``exc`` (cancellation passes through)."""
    if isinstance(exc, WorkerStartFailed | asyncio.CancelledError):
        return exc
    if isinstance(exc, TimeoutError):
        return WorkerStartFailed(StartFailure.TIMEOUT, "worker timed out loading")
    if isinstance(exc, WorkerGone):
        return WorkerStartFailed(StartFailure.EXITED, "worker exited while loading")
    if isinstance(exc, codec.ProtocolError):
        return WorkerStartFailed(StartFailure.PROTOCOL, f"worker broke the protocol: {exc}")
    if isinstance(exc, Exception):
        return WorkerStartFailed(StartFailure.EXITED, f"worker failed to start: {exc}")
    return exc
