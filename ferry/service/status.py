"""Point-in-time status of model versions and their workers (what describe reports)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ferry.procinfo import resident_bytes
from ferry.scheduling.model_runner import ModelRunner
from ferry.scheduling.pool import SlotState, WorkerSlot
from ferry.scheduling.registry import ModelVersion

_STATES = {
    SlotState.READY: "READY",
    SlotState.BUSY: "READY",
    SlotState.STARTING: "STARTING",
    SlotState.RESTARTING: "STARTING",
    SlotState.FAILED: "STARTING",
    SlotState.STOPPED: "UNLOADING",
}


@dataclass(frozen=True)
class WorkerStatus:
    id: str
    start_time: float | None
    """Epoch seconds the current process became ready."""
    status: str
    pid: int | None
    memory_bytes: int
    gpu: bool
    device: str
    restarts: int
    last_error: str
    model_memory_bytes: int = 0
    """What loading the model added to its process's memory, measured at the load."""
    model_gpu_bytes: int = 0
    shared: bool = False
    """Its process hosts other models too (``processGroup``)."""
    shared_weights_bytes: int = 0
    """The weights it maps from one file with the model's other workers (counted once)."""


@dataclass(frozen=True)
class ModelStatus:
    name: str
    version: str
    url: str
    min_workers: int
    max_workers: int
    batch_size: int
    max_batch_delay_ms: float
    response_timeout: float
    loaded_at_startup: bool
    workers: list[WorkerStatus]
    queue_capacity: int
    pending_requests: int | None
    """None where the queues are not in sight (on Ray, each replica holds its own)."""
    ready: bool
    """At least one worker can take requests."""
    last_error: str
    """Why a worker last failed to load or died, while the model is short of workers."""
    startup_timeout: float = 120.0
    """Seconds a worker may take to load the model."""
    gpu_ids: tuple[int, ...] = ()
    """The GPUs the workers use; none means they run on the CPU."""
    client_timeout_ms: float | None = None
    """``clientTimeoutInMills``: the deadline of requests that bring none."""
    deadline_action: str = "reject"
    """``deadlineAction``: ``reject`` or ``delay`` a request that misses its deadline."""
    batch_policy: dict[str, Any] = field(default_factory=dict)
    """The batch policy's name and state (``describe``: its learned cost curve)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields of the describe document beyond TorchServe's (on Ray: ``ray``)."""


def _worker_status(slot: WorkerSlot) -> WorkerStatus:
    info = slot.worker.info if slot.worker is not None else None
    pid = info.pid if info is not None else None
    device = info.device if info is not None else ""
    return WorkerStatus(
        id=f"{slot.index}",
        start_time=slot.ready_since,
        # FAILED only once the slot gave up; a failed start about to be retried is STARTING.
        status="FAILED" if slot.gave_up else _STATES[slot.state],
        pid=pid,
        memory_bytes=resident_bytes(pid) if pid is not None else 0,
        gpu=device.startswith("cuda"),
        device=device,
        restarts=slot.restarts,
        last_error=slot.last_error,
        model_memory_bytes=info.footprint_bytes if info is not None else 0,
        model_gpu_bytes=info.gpu_bytes if info is not None else 0,
        shared=info.shared if info is not None else False,
        shared_weights_bytes=info.shared_weights_bytes if info is not None else 0,
    )


def model_status(entry: ModelVersion) -> ModelStatus:
    runner, archive = entry.runner, entry.archive
    return ModelStatus(
        name=archive.name,
        version=archive.version,
        url=archive.source,
        min_workers=len(runner.slots),
        max_workers=runner.max_workers,
        batch_size=runner.settings.batch_size,
        max_batch_delay_ms=runner.settings.max_batch_delay * 1000,
        response_timeout=runner.settings.response_timeout,
        loaded_at_startup=entry.loaded_at_startup,
        workers=[_worker_status(slot) for slot in runner.slots],
        queue_capacity=runner.queue.capacity,
        pending_requests=runner.waiting,
        ready=runner.is_ready(),
        last_error=runner.last_error(),
        startup_timeout=runner.settings.startup_timeout,
        gpu_ids=runner.settings.gpu_ids,
        client_timeout_ms=runner.settings.client_timeout_ms,
        deadline_action=runner.settings.deadline_action,
        batch_policy=runner.queue.describe(),
        extra={**_sequence_fields(runner), **_group_fields(runner)},
    )


def _group_fields(runner: ModelRunner) -> dict[str, Any]:
    """Ferry: the process group whose processes the model shares, when it shares any;
    for a model loaded on demand, that it is, and whether it is resident now."""
    fields: dict[str, Any] = {}
    if runner.settings.process_group:
        fields["processGroup"] = runner.settings.process_group
    if runner.settings.load_on_demand:
        fields["loadOnDemand"] = True
        fields["resident"] = runner.resident()
    return fields


def _sequence_fields(runner: ModelRunner) -> dict[str, Any]:
    """A stateful model's describe fields (TorchServe's names; ``openSequences``: Ferry)."""
    limits, book = runner.settings.sequences, runner.sequences
    if limits is None or book is None:
        return {}
    return {
        "stateful": True,
        "sequenceMaxIdleMSec": round(limits.max_idle * 1000),
        "sequenceTimeoutMSec": round((limits.timeout or 0) * 1000),
        "maxNumSequence": limits.max_sequences,
        "maxSequenceJobQueueSize": limits.queue_size,
        "openSequences": book.open_sequences,
    }
