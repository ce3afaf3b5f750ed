"""The frontend's handle on one worker process: spawn it, send batches, notice when it dies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys

from ferry.worker import codec
from ferry.worker.messages import (
    BatchResult,
    Message,
    PredictBatch,
    WorkerLoadFailed,
    WorkerReady,
)
from ferry.worker.spec import WorkerSpec
from ferry.worker.torch_setup import worker_environment

log = logging.getLogger("ferry.worker")


async def _relay_output(stream: asyncio.StreamReader, prefix: str) -> None:
    """Worker stdout/stderr, line by line, into the frontend's log with the worker's name."""
    output = logging.getLogger("ferry.worker.output")
    while True:
        try:
            line = await stream.readline()
        except ValueError:  # a line longer than the stream limit: take what is there
            line = await stream.read(1 << 16)
        if not line:
            return
        output.info("%s %s", prefix, line.decode(errors="replace").rstrip())


class WorkerGone(Exception):
    """The worker process exited or closed its socket."""


class WorkerStartFailed(Exception):
    """The worker could not load its handler (or did not come up in time)."""


class WorkerProcess:
    """One spawned worker and the socket pair that connects it to the frontend."""

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
        self.device = "cpu"
        self.exited = asyncio.ensure_future(process.wait())
        assert process.stdout is not None
        prefix = f"[{spec.model_name} {spec.worker_id} pid {process.pid}]"
        self._output = asyncio.ensure_future(_relay_output(process.stdout, prefix))

    @classmethod
    async def start(cls, spec: WorkerSpec, startup_timeout: float) -> WorkerProcess:
        """Spawn the worker and wait until it has loaded its handler."""
        parent_sock, child_sock = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "ferry.worker.main",
                "--fd",
                str(child_sock.fileno()),
                "--spec",
                spec.to_json(),
                pass_fds=(child_sock.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=worker_environment(os.environ),
            )
        finally:
            child_sock.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
        worker = cls(spec, process, reader, writer)
        try:
            message = await asyncio.wait_for(worker._receive(), startup_timeout)
        except (WorkerGone, TimeoutError) as exc:
            worker.kill()
            reason = (
                "timed out loading" if isinstance(exc, TimeoutError) else "exited while loading"
            )
            raise WorkerStartFailed(f"worker {reason}") from exc
        if isinstance(message, WorkerLoadFailed):
            worker.kill()
            raise WorkerStartFailed(message.message)
        if not isinstance(message, WorkerReady):
            worker.kill()
            raise WorkerStartFailed(f"unexpected first message {type(message).__name__}")
        worker.device = message.device
        return worker

    async def _receive(self) -> Message:
        try:
            header = await self._reader.readexactly(codec.FRAME_HEADER.size)
            payload = await self._reader.readexactly(codec.frame_length(header))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise WorkerGone(f"worker {self.pid} closed its connection") from exc
        return codec.decode(payload)

    def send(self, batch: PredictBatch) -> None:
        """Queue a batch for the worker; a dead worker shows up when its result is awaited."""
        if not self._writer.is_closing():
            self._writer.write(codec.encode(batch))

    async def result(self, batch_id: int, timeout: float) -> BatchResult:
        """The result of the batch sent last; TimeoutError if the worker is too slow."""
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise WorkerGone(f"worker {self.pid} is gone") from exc
        message = await asyncio.wait_for(self._receive(), timeout)
        if not isinstance(message, BatchResult) or message.batch_id != batch_id:
            raise WorkerGone(f"worker {self.pid} answered out of protocol; replacing it")
        return message

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self._writer.close()
