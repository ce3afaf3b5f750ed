"""A request on its way through the queue to a worker, and the answer it waits for."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ferry.errors import DeadlineExceeded, FerryError
from ferry.wire.messages import InputPart, RequestItem

_request_ids = itertools.count(1)

LATE_PRIORITY = -1000
"""Below every priority a client may ask for (x-ferry-priority: -100 to 100): where a
request that missed its deadline waits under ``deadlineAction: delay``."""


def next_request_id() -> str:
    return f"r{next(_request_ids)}"


@dataclass(frozen=True)
class Prediction:
    """A handler's answer to one request: what a job's future holds, and what the service
    gives every transport (``ferry.service.types`` names it there)."""

    body: bytes
    content_type: str
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    batch_size: int = 1
    """How many requests shared this request's batch."""
    queued_seconds: float = 0.0
    request_id: str = ""
    """The id the request ran under: the client's ``x-request-id`` or a generated one."""
    trace_ids: tuple[str, str] | None = None
    """Its trace and span ids (hex) when it is traced: the access log line carries them."""


@dataclass(frozen=True)
class PredictionPart:
    """A part of the answer a handler streamed ahead of its last one
    (``send_intermediate_predict_response``), as a transport receives it."""

    body: bytes
    content_type: str
    status: int
    request_id: str


OnPredictionPart = Callable[[PredictionPart], None]


class RequestWatch(Protocol):
    """What an observer (``ferry.scheduling.observers``) keeps of one request, from its
    taking to its answer."""

    @property
    def ids(self) -> tuple[str, str]:
        """Ids (trace and span, in hex) the request's access log line carries."""
        ...

    def ended(self, outcome: Prediction | BaseException, queued_seconds: float) -> None:
        """Its answer, or the error it failed with (``CancelledError`` when its transport
        gave up on it), and how long it waited for its first worker."""
        ...


@dataclass
class Job:
    item: RequestItem
    future: asyncio.Future[Prediction]
    on_part: OnPredictionPart | None = None
    """Where the parts the handler streams go (dropped without it)."""
    streamed: int = 0
    """Parts passed on so far: a job that streamed is never run again."""
    attempts: int = 0
    """Times a worker started on it."""
    returns: int = 0
    """Times it came back from a failed worker that had not started on it."""
    enqueued_at: float = field(default_factory=time.monotonic)
    queued_seconds: float = 0.0
    """Arrival to first dispatch to a worker."""
    deadline: float | None = None
    """``time.monotonic()`` by which the client wants its answer (x-ferry-deadline-ms)."""
    priority: int = 0
    """Higher goes into a batch first (x-ferry-priority); ``LATE_PRIORITY`` once it
    missed its deadline under ``deadlineAction: delay``."""
    sequence_id: str | None = None
    """The stateful sequence it belongs to (``ferry.scheduling.sequences``), if any."""
    watch: RequestWatch | None = None
    """What an observer keeps of it, when one watches it (``ferry.scheduling.observers``)."""

    def expire(self) -> None:
        """The deadline passed: answer now unless a worker already has the request."""
        if self.attempts == 0 and not self.future.done():
            self.fail(DeadlineExceeded("the request's deadline passed while it was queued"))

    def stream(self, part: PredictionPart) -> None:
        if self.future.done():
            return
        self.streamed += 1
        if self.on_part is not None:
            try:
                self.on_part(part)
            except FerryError as error:  # e.g. the parts outgrew max_response_size
                self.fail(error)

    def resolve(self, response: Prediction) -> None:
        if not self.future.done():
            self.future.set_result(response)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


__all__ = [
    "LATE_PRIORITY",
    "InputPart",
    "Job",
    "OnPredictionPart",
    "Prediction",
    "PredictionPart",
    "RequestWatch",
    "next_request_id",
]
