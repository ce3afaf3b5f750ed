"""Point-in-time status of model versions and their workers (what describe reports)."""

from __future__ import annotations

from dataclasses import dataclass

from ferry.procinfo import resident_bytes
from ferry.scheduling.model_runner import WorkerSlot
from ferry.scheduling.registry import ModelVersion

_STATES = {
    "ready": "READY",
    "busy": "READY",
    "starting": "STARTING",
    "restarting": "STARTING",
    "failed": "FAILED",
    "stopped": "UNLOADING",
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
    pending_requests: int


def _worker_status(slot: WorkerSlot) -> WorkerStatus:
    worker = slot.worker
    pid = worker.pid if worker is not None else None
    return WorkerStatus(
        id=f"{slot.index}",
        start_time=slot.ready_since,
        status=_STATES.get(slot.state, slot.state.upper()),
        pid=pid,
        memory_bytes=resident_bytes(pid) if pid is not None else 0,
        gpu=worker is not None and worker.device.startswith("cuda"),
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
        pending_requests=len(runner.queue),
    )
