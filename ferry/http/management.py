"""TorchServe's management API: register, scale, describe, list, unregister, set-default."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry.errors import ModelNotFound
from ferry.http.errors import exception_handlers, guarded
from ferry.http.openapi import description_routes, management_description
from ferry.http.params import Params
from ferry.http.workflows import workflow_management_routes
from ferry.service import FerryService
from ferry.service_types import RegisterRequest
from ferry.status import ModelStatus, WorkerStatus
from ferry.workflows.manager import WorkflowManager

log = logging.getLogger("ferry.http")

MAX_PARAMS_BODY = 1 << 20


def _json(document: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(document, indent=2), status_code=status, media_type="application/json"
    )


def _status(message: str, status: int = 200) -> Response:
    return _json({"status": message}, status)


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
    }


_TORCHSERVE_ONLY_FIELDS: dict[str, Any] = {
    # Describe fields of TorchServe features Ferry does not have, at TorchServe's defaults,
    # so clients that read them find them: retries, torchrun parallelism, job tickets,
    # per-model virtual environments, stateful sequences, continuous batching.
    "maxRetryTimeoutInSec": 300,
    "clientTimeoutInMills": 0,
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
    return {
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
        **_TORCHSERVE_ONLY_FIELDS,
        "loadedAtStartup": model.loaded_at_startup,
        "workers": [_worker_json(worker) for worker in model.workers],
        "ready": model.ready,
        "loadError": model.last_error or None,
        "jobQueueStatus": {
            "remainingCapacity": model.queue_capacity - model.pending_requests,
            "pendingRequests": model.pending_requests,
        },
    }


def _add_customized(described: list[dict[str, Any]], metadata: bytes) -> None:
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


def management_app(service: FerryService, workflows: WorkflowManager) -> Starlette:
    record = service.metrics.response_recorder("management")

    async def list_or_register(request: Request) -> Response:
        params = await Params.read(request, MAX_PARAMS_BODY)
        if request.method == "GET":
            limit = params.integer("limit")
            page = service.list_models(
                100 if limit is None else limit, params.integer("next_page_token") or 0
            )
            document: dict[str, Any] = {
                "models": [{"modelName": name, "modelUrl": url} for name, url in page.models]
            }
            if page.next_page_token is not None:
                document["nextPageToken"] = page.next_page_token
            return _json(document)
        return await register(params)

    async def register(params: Params) -> Response:
        url = params.text("url", required=True, empty_ok=True) or ""
        if not url:  # present but empty: TorchServe's 404, not the 400 for a missing url
            raise ModelNotFound("empty url")
        registration = RegisterRequest(
            url=url,
            model_name=params.text("model_name"),
            handler=params.text("handler"),
            runtime=params.text("runtime"),
            batch_size=params.integer("batch_size", minimum=1),
            max_batch_delay_ms=params.number("max_batch_delay"),
            initial_workers=params.integer("initial_workers", minimum=0),
            # TorchServe's code registers synchronously unless told not to (its docs say
            # the opposite; its own test suite relies on the code).
            synchronous=params.flag("synchronous", default=True),
            response_timeout=params.number("response_timeout", minimum=1),
            startup_timeout=params.number("startup_timeout", minimum=0),
        )
        registered = await service.register(registration)
        name, version = registered.model.name, registered.model.version
        workers = registered.workers
        if not registered.ready:
            return _status("Processing worker updates...", 202)
        message = f'Model "{name}" Version: {version} registered with {workers} initial workers'
        if workers == 0:
            message += ". Use scale workers API to add workers for the model."
        return _status(message)

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]
        version = request.path_params.get("version")
        params = await Params.read(request, MAX_PARAMS_BODY)
        if request.method == "GET":
            described = [model_json(status) for status in service.describe(name, version)]
            if params.flag("customized", default=False) and version != "all":
                metadata = await service.customized_metadata(name, version)
                _add_customized(described, metadata)
            return _json(described)
        if request.method == "DELETE":
            await service.unregister(name, version)
            return _status(f'Model "{name}" unregistered')
        min_worker = params.integer("min_worker", minimum=0)
        min_worker = 1 if min_worker is None else min_worker
        max_worker = params.integer("max_worker", minimum=0)
        synchronous = params.flag("synchronous", default=False)
        scaled = await service.scale(
            name, version, min_worker, min_worker if max_worker is None else max_worker, synchronous
        )
        if not synchronous:
            return _status("Processing worker updates...", 202)
        suffix = f", version: {version}" if version else ""
        return _status(f"Workers scaled to {scaled.workers} for model: {name}{suffix}")

    async def set_default(request: Request) -> Response:
        name, version = request.path_params["name"], request.path_params["version"]
        service.set_default(name, version)
        return _status(f'Default version successfully updated for model "{name}" to "{version}"')

    routes = [
        Route("/models", guarded(list_or_register, record), methods=["GET", "POST"]),
        Route("/models/{name}", guarded(one_model, record), methods=["GET", "PUT", "DELETE"]),
        Route(
            "/models/{name}/{version}", guarded(one_model, record), methods=["GET", "PUT", "DELETE"]
        ),
        Route(
            "/models/{name}/{version}/set-default", guarded(set_default, record), methods=["PUT"]
        ),
        *workflow_management_routes(workflows, record),
        *description_routes(management_description()),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers(record))
