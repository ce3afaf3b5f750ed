"""The frontend's end of one worker's socket: the exchange every worker handle speaks,
whether the worker has a process of its own (``process``) or shares one (``hosts``)."""

from __future__ import annotations

import asyncio
from typing import NoReturn

from ferry.wire import codec
from ferry.wire.messages import (
    BatchResult,
    CancelRequests,
    Message,
    PartialResult,
    PredictBatch,
    SpecTaken,
    StartWorker,
    WorkerLoadFailed,
    WorkerReady,
)
from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.handle import StartFailure, WorkerGone, WorkerInfo, WorkerStartFailed


class SpareUnresponsive(Exception):
    """A spare process did not answer its spec in time (stopped, hung, or overloaded)."""


class WorkerConnection:
    """Frames to and from one worker; counts the batches it holds unanswered."""

    def __init__(
        self, spec: WorkerSpec, pid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.spec = spec
        self.pid = pid
        self._reader = reader
        self._writer = writer
        self.device = "unknown"
        self.ready = WorkerReady(pid or 0, "unknown")
        """Its load's report: device, footprint, the weights it maps (once loaded)."""
        self.batches_held = 0
        """Batches sent and not yet answered: a worker killed holding some takes them along."""

    def worker_info(self, shared_process: bool = False) -> WorkerInfo:
        """What its load measured (``shared_process``: its process hosts other models)."""
        ready = self.ready
        return WorkerInfo(
            self.pid,
            self.device,
            ready.footprint_bytes,
            ready.gpu_bytes,
            shared=shared_process,
            shared_weights_bytes=ready.shared_bytes,
            shared_weights_key=ready.shared_key,
        )

    async def _handshake(self, spec: WorkerSpec, taken_within: float | None = None) -> None:
        """Send the spec and wait until the handler has loaded. ``taken_within``: a spare
        process must answer the spec (``SpecTaken``) within that many seconds, else
        ``SpareUnresponsive``."""
        self._writer.write(codec.encode(StartWorker(spec)))
        await self._writer.drain()
        if taken_within is not None:
            await self._spec_taken(taken_within)
        message = await self._receive()
        if isinstance(message, WorkerLoadFailed):
            kind = StartFailure.OUT_OF_MEMORY if message.out_of_memory else StartFailure.LOAD_ERROR
            raise WorkerStartFailed(kind, message.message)
        if not isinstance(message, WorkerReady):
            raise codec.ProtocolError(f"unexpected first message {type(message).__name__}")
        self.device = message.device
        self.ready = message

    async def _spec_taken(self, within: float) -> None:
        try:
            message = await asyncio.wait_for(self._receive(), within)
        except TimeoutError:
            raise SpareUnresponsive(f"no answer to its spec within {within:.0f} s") from None
        if not isinstance(message, SpecTaken):
            raise codec.ProtocolError(f"unexpected first message {type(message).__name__}")

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
        self.batches_held += 1
        self._writer.write(codec.encode(batch))
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise WorkerGone(f"worker {self.pid} is gone") from exc

    async def receive(self) -> BatchResult | PartialResult:
        message = await self._receive()
        if not isinstance(message, BatchResult | PartialResult):
            raise codec.ProtocolError(f"worker {self.pid} sent {type(message).__name__}")
        if isinstance(message, BatchResult):
            self.batches_held -= 1
        return message

    def cancel(self, batch_id: int, request_ids: list[str]) -> None:
        if not self._writer.is_closing():  # a few bytes: written without waiting
            self._writer.write(codec.encode(CancelRequests(batch_id, request_ids)))


def raise_start_failure(exc: BaseException) -> NoReturn:
    """Raise the ``WorkerStartFailed`` that explains ``exc`` (cancellation as it is)."""
    failure = start_failure(exc)
    if failure is exc:
        raise exc
    raise failure from exc


def start_failure(exc: BaseException) -> BaseException:
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
