"""TorchServe's describe document, the same over every transport (REST's
``GET /models/NAME`` and gRPC's ``DescribeModel`` answer this JSON)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from ferry.service.status import ModelStatus, WorkerStatus

log = logging.getLogger("ferry.describe")


def _timestamp(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(epoch, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _worker_json(worker: WorkerStatus) -> dict[str, Any]:
    return {
        "id": worker.id,
        "startTime": _timestamp(worker.start_time),
        "status": worker.status,
        "memoryUsage": worker.memory_bytes,
        "pid": worker.pid,
        "gpu": worker.gpu,
        "gpuUsage": "N/A",
        "device": worker.device or None,
        "restarts": worker.restarts,
        "lastError": worker.last_error or None,
        "modelMemory": worker.model_memory_bytes,
        "modelGpuMemory": worker.model_gpu_bytes,
        "sharedWeights": worker.shared_weights_bytes,
        "sharedProcess": worker.shared,
    }


_TORCHSERVE_ONLY_FIELDS: dict[str, Any] = {
    # Describe fields of TorchServe features Ferry does not have, at TorchServe's defaults,
    # so clients that read them find them: retries, torchrun parallelism, job tickets,
    # per-model virtual environments, continuous batching; a stateful model overrides the
    # sequence fields (ferry.service.status).
    "maxRetryTimeoutInSec": 300,
    "parallelType": "",
    "parallelLevel": 1,
    "continuousBatching": False,
    "useJobTicket": False,
    "useVenv": False,
    "stateful": False,
    "sequenceMaxIdleMSec": 0,
    "sequenceTimeoutMSec": 0,
    "maxNumSequence": 1,
    "maxSequenceJobQueueSize": 1,
}


def model_json(model: ModelStatus) -> dict[str, Any]:
    """A describe entry with TorchServe's field names."""
    document = {
        "modelName": model.name,
        "modelVersion": model.version,
        "modelUrl": model.url,
        "runtime": "python",
        "minWorkers": model.min_workers,
        "maxWorkers": model.max_workers,
        "batchSize": model.batch_size,
        "maxBatchDelay": round(model.max_batch_delay_ms),
        "responseTimeout": round(model.response_timeout),
        "startupTimeout": round(model.startup_timeout),
        "jobQueueSize": model.queue_capacity,
        "deviceType": "gpu" if model.gpu_ids else "cpu",
        "deviceIds": list(model.gpu_ids),
        "batchPolicy": model.batch_policy,
        **_TORCHSERVE_ONLY_FIELDS,
        "clientTimeoutInMills": round(model.client_timeout_ms or 0),
        "deadlineAction": model.deadline_action,
        "loadedAtStartup": model.loaded_at_startup,
        "workers": [_worker_json(worker) for worker in model.workers],
        "ready": model.ready,
        "loadError": model.last_error or None,
        **model.extra,
    }
    if model.pending_requests is not None:
        document["jobQueueStatus"] = {
            "remainingCapacity": model.queue_capacity - model.pending_requests,
            "pendingRequests": model.pending_requests,
        }
    return document


def add_customized(described: list[dict[str, Any]], metadata: bytes) -> None:
    """TorchServe's ``customizedMetadata``: the handler's ``describe_handle`` answer when it
    is a JSON object (``{}`` for anything else), left out when it answered None."""
    try:
        document = json.loads(metadata) if metadata.strip() else None
    except ValueError:
        document = {}
    if document is None or len(described) != 1:
        return
    if not isinstance(document, dict):
        log.warning("describe_handle returned %s, not a JSON object", type(document).__name__)
        document = {}
    described[0]["customizedMetadata"] = document
