"""Typed messages between the frontend and a worker process.

Every frame is ``[PROTOCOL_VERSION, tag, fields...]`` in msgpack behind a 4-byte
length, its fields derived from the message's dataclass (``ferry.wire.field_codec``;
the tags in ``ferry.wire.codec``); request bodies travel as raw bytes, never pickled.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ferry.wire.spec import WorkerSpec

PROTOCOL_VERSION = 11
"""2: the worker gets its spec as the first frame (``StartWorker``), not on its command line.
3: a worker may send ``PartialResult`` frames before a batch's ``BatchResult``.
4: the frontend may send ``CancelRequests`` while a batch runs.
5: each ``RequestItem`` carries the request envelope its protocol is read with.
6: a ``PredictBatch`` carries its trace context, a ``BatchResult`` its stages' windows.
7: a spare process answers its spec with ``SpecTaken`` before it loads the model.
8: ``WorkerReady`` says which weights files the worker maps, shared with its model's others.
9: ``StartWorker`` carries the spec as its dataclass's fields, not a mapping.
10: ``WorkerLoadFailed`` says whether the load ran out of memory.
11: ``StartWorker``'s spec holds the handler's part whole (``HandlerSpec``)."""


DEVICE_FAILED_EXIT = 70
"""A worker's exit status after a sticky GPU error (``ferry.worker.device_failure``): it
left the batch that met the error unanswered, as a crash would."""

HOST_READY = b"R"
"""A host's one message on its control socket (``ferry.worker.host``): torch is imported."""
MODEL_SOCKET = b"M"
"""The byte the frontend sends a host with each model's socket (its file descriptor)."""


@dataclass(frozen=True)
class InputPart:
    """One input of a request: the raw body (``name="body"``) or one form field."""

    name: str
    content_type: str
    data: bytes


@dataclass(frozen=True)
class RequestItem:
    request_id: str
    headers: dict[str, str]
    parts: list[InputPart]
    envelope: str = ""
    """TorchServe's request envelope the request's protocol is read with (``kserve`` for
    KServe V1, ``kservev2`` for the Open Inference Protocol); "" for TorchServe's own APIs.
    The worker applies it only where ``service_envelope`` is unset and the handler is
    TorchServe's kind (``ferry.worker.loading``)."""


@dataclass(frozen=True)
class PredictBatch:
    batch_id: int
    items: list[RequestItem]
    traceparent: str = ""
    """The batch span's W3C ``traceparent`` when it is traced (``ferry.tracing``): the
    worker's log records of the batch name its trace and span."""


@dataclass(frozen=True)
class StageWindow:
    """When a handler stage of a batch ran, in the worker's wall clock (nanoseconds since
    the epoch): the span a trace draws for it."""

    stage: str
    start_ns: int
    end_ns: int


class ErrorKind(enum.StrEnum):
    """How a worker reports one request's failure (``ItemResult.error_kind``); the
    dispatcher turns it into the domain error."""

    NONE = ""
    """Answered."""
    INVALID_INPUT = "invalid_input"
    """The request could not be read (``ferry.errors.InvalidInput``)."""
    HANDLER = "handler"
    """The handler failed on it (with the status it asked for, if any)."""


@dataclass(frozen=True)
class ItemResult:
    """The answer to one request; ``status`` is what the handler asked for, if anything."""

    request_id: str
    body: bytes
    content_type: str
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    error_kind: ErrorKind = ErrorKind.NONE
    message: str = ""


@dataclass(frozen=True)
class PartialResult:
    """One streamed part of a request's answer, sent while its batch still runs
    (TorchServe's ``send_intermediate_predict_response``); the ``BatchResult`` that ends
    the batch carries the request's last part."""

    batch_id: int
    request_id: str
    body: bytes
    content_type: str
    status: int = 200


@dataclass(frozen=True)
class HandlerMetricValue:
    """One value a handler recorded through ``context.metrics`` during the batch."""

    name: str
    value: float
    unit: str
    kind: str
    dimensions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchResult:
    batch_id: int
    results: list[ItemResult]
    handler_ms: float
    metrics: list[HandlerMetricValue] = field(default_factory=list)
    stage_ms: dict[str, float] = field(default_factory=dict)
    """Handler stages timed in the worker; ``handle`` alone for handlers without stages."""
    stage_windows: list[StageWindow] = field(default_factory=list)
    """Each call of each stage, in order (the whole batch as ``handle`` without stages)."""


@dataclass(frozen=True)
class CancelRequests:
    """The clients of these requests of a batch went away: parts streamed to them are
    dropped, and a handler streaming only to them is stopped (``RequestCancelled``)."""

    batch_id: int
    request_ids: list[str]


@dataclass(frozen=True)
class StartWorker:
    """The first frame to a new worker: what it loads and how it runs."""

    spec: WorkerSpec


@dataclass(frozen=True)
class WorkerReady:
    pid: int
    device: str
    footprint_bytes: int = 0
    """What loading the model added to the process's own resident memory (its mapped
    weights files aside)."""
    gpu_bytes: int = 0
    """What loading it added to the GPU memory torch holds (0 on a CPU)."""
    shared_bytes: int = 0
    """The size of the weights files it maps, shared with the model's other workers
    (``ferry.handlers.builtin.shared_weights``): counted once per model."""
    shared_key: str = ""
    """Those files' paths, which workers sharing one copy have in common."""


@dataclass(frozen=True)
class WorkerLoadFailed:
    message: str
    out_of_memory: bool = False
    """The load ran out of memory (``MemoryError``, torch's ``OutOfMemoryError``): the
    frontend reports it as such (SageMaker's multi-model loads answer 507)."""


@dataclass(frozen=True)
class SpecTaken:
    """A spare process's answer to its spec, before it loads the model: it is alive and
    reading (``ferry.worker_handles.spares``: one that does not answer promptly is
    replaced)."""

    pid: int


Message = (
    PredictBatch
    | BatchResult
    | PartialResult
    | CancelRequests
    | StartWorker
    | WorkerReady
    | WorkerLoadFailed
    | SpecTaken
)
