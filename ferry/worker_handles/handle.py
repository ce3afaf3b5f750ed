"""The seam between the scheduling core and a worker: what it may ask of one, nothing more.

The scheduling core (``ferry.scheduling``) never names a process class. It receives a
``WorkerFactory`` that starts a worker for a ``WorkerSpec`` and returns a ``WorkerHandle``;
``ferry.worker_handles.process.WorkerProcess`` is the local implementation, unit tests use fakes,
and a remote worker can implement the same protocol.

    WorkerStartFailed     the worker could not come up; ``kind`` says whether retrying helps
    WorkerGone            the worker exited or closed its connection
    (anything else)       a broken exchange (e.g. ``codec.ProtocolError``): the core treats
                          every exception from a handle as "this worker must go"
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ferry.wire.messages import BatchResult, PartialResult, PredictBatch
from ferry.wire.spec import WorkerSpec


class StartFailure(enum.Enum):
    """Why a worker did not come up."""

    LOAD_ERROR = "load_error"
    """The handler raised while loading (import error, bad weights ...): deterministic."""
    EXITED = "exited"
    """The process died while loading (killed, out of memory ...)."""
    TIMEOUT = "timeout"
    """It did not report ready within the start-up timeout."""
    SPAWN = "spawn"
    """The process could not be started at all (an ``OSError``)."""
    PROTOCOL = "protocol"
    """It answered something that is not this protocol (a mismatched Ferry version)."""
    OUT_OF_MEMORY = "out_of_memory"
    """The handler ran out of memory while loading: another try may fit once memory is
    freed (SageMaker evicts a model and loads again on a 507)."""

    @property
    def load_ended(self) -> bool:
        """The worker reported the failure itself: its load is over (a host's thread that
        ran it has ended)."""
        return self in (StartFailure.LOAD_ERROR, StartFailure.OUT_OF_MEMORY)

    @property
    def deterministic(self) -> bool:
        """Retrying the same spec gives the same failure, so retries only add noise."""
        return self in (StartFailure.LOAD_ERROR, StartFailure.SPAWN, StartFailure.PROTOCOL)


class WorkerStartFailed(Exception):
    def __init__(self, kind: StartFailure, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class WorkerGone(Exception):
    """The worker process exited or closed its connection."""


@dataclass(frozen=True)
class WorkerInfo:
    pid: int | None
    device: str
    """Where the handler actually runs (``cpu``, ``cuda:0`` ...), as the worker reported it."""
    footprint_bytes: int = 0
    """What loading the model added to its process's own resident memory, as measured
    there (mapped weights files aside)."""
    gpu_bytes: int = 0
    """What loading it added to the GPU memory torch holds."""
    shared: bool = False
    """Its process hosts other models too (``ferry.worker_handles.hosts``)."""
    shared_weights_bytes: int = 0
    """The weights files it maps, shared with the model's other workers: the model's
    footprint counts them once (``shared_weights_key`` tells which)."""
    shared_weights_key: str = ""

    @property
    def shared_weights_on_gpu(self) -> bool:
        """Its shared weights are a weights keeper's copy in GPU memory (its device's),
        not a file in the page cache (``ferry.handlers.builtin.shared_weights``)."""
        return self.shared_weights_key.startswith("keeper:cuda:")


class WorkerHandle(Protocol):
    """One started worker. Calls may raise ``WorkerGone`` or any other exception; the
    caller then kills the worker and answers or retries what it held."""

    @property
    def info(self) -> WorkerInfo: ...

    @property
    def exited(self) -> asyncio.Future[Any]:
        """Done once the worker has exited."""
        ...

    async def send(self, batch: PredictBatch) -> None:
        """Hand a batch to the worker; returns once it is written out."""
        ...

    async def receive(self) -> BatchResult | PartialResult:
        """The next message about the oldest batch sent: parts it streamed, then its result."""
        ...

    def cancel(self, batch_id: int, request_ids: list[str]) -> None:
        """Tell the worker these requests of a batch it holds lost their client (it
        stops streaming to them); never blocks, and does nothing once it is gone."""
        ...

    def kill(self) -> None:
        """Stop the worker now; safe to call more than once."""
        ...


WorkerFactory = Callable[[WorkerSpec, float], Awaitable[WorkerHandle]]
"""Starts a worker for a spec within a start-up timeout (seconds); raises
``WorkerStartFailed``."""
