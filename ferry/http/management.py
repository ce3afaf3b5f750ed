"""TorchServe's management API: register, scale, describe, list, unregister, set-default.

Listing, describing and scaling take any ``ModelOperations``: ``ferry serve --ray``'s
management API is these same calls over Ray Serve deployments (``operations_routes``)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry.batching.registry import BATCH_POLICIES
from ferry.config.model_config import read_policy_option
from ferry.errors import InvalidRequest, ModelConfigError, ModelNotFound
from ferry.http.errors import StatusRecorder, exception_handlers, guarded
from ferry.http.openapi import description_routes, management_description
from ferry.http.params import Params
from ferry.http.workflows import workflow_management_routes
from ferry.protocols.describe import add_customized, model_json
from ferry.service import FerryService
from ferry.service.types import ModelOperations, RegisterRequest
from ferry.workflows.manager import WorkflowManager

log = logging.getLogger("ferry.http")

MAX_PARAMS_BODY = 1 << 20


def _json(document: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(document, indent=2), status_code=status, media_type="application/json"
    )


def _status(message: str, status: int = 200) -> Response:
    return _json({"status": message}, status)


async def list_models(models: ModelOperations, params: Params) -> Response:
    limit = params.integer("limit")
    page = models.list_models(
        100 if limit is None else limit, params.integer("next_page_token") or 0
    )
    document: dict[str, Any] = {
        "models": [{"modelName": name, "modelUrl": url} for name, url in page.models]
    }
    if page.next_page_token is not None:
        document["nextPageToken"] = page.next_page_token
    return _json(document)


def described(models: ModelOperations, name: str, version: str | None) -> list[dict[str, Any]]:
    return [model_json(status) for status in models.describe(name, version)]


async def scale(
    models: ModelOperations, name: str, version: str | None, params: Params
) -> Response:
    """``PUT /models/M[/V]?min_worker=N[&max_worker=M][&synchronous=true]``."""
    min_worker = params.integer("min_worker", minimum=0)
    min_worker = 1 if min_worker is None else min_worker
    max_worker = params.integer("max_worker", minimum=0)
    synchronous = params.flag("synchronous", default=False)
    scaled = await models.scale(
        name, version, min_worker, min_worker if max_worker is None else max_worker, synchronous
    )
    if not synchronous:
        return _status("Processing worker updates...", 202)
    suffix = f", version: {version}" if version else ""
    return _status(f"Workers scaled to {scaled.workers} for model: {name}{suffix}")


def operations_routes(models: ModelOperations, record: StatusRecorder) -> list[Route]:
    """List, describe and scale alone, over ``models``."""

    async def listing(request: Request) -> Response:
        return await list_models(models, await Params.read(request, MAX_PARAMS_BODY))

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]
        version = request.path_params.get("version")
        params = await Params.read(request, MAX_PARAMS_BODY)
        if request.method == "GET":  # in a thread: ``models`` may ask another process
            return _json(await asyncio.to_thread(described, models, name, version))
        if params.text("batch_policy") is not None:
            raise InvalidRequest("batch_policy cannot be set here; set it in model-config.yaml")
        return await scale(models, name, version, params)

    return [
        Route("/models", guarded(listing, record), methods=["GET"]),
        Route("/models/{name}", guarded(one_model, record), methods=["GET", "PUT"]),
        Route("/models/{name}/{version}", guarded(one_model, record), methods=["GET", "PUT"]),
    ]


def _registration(params: Params) -> RegisterRequest:
    """``POST /models``'s parameters; an empty ``url`` is TorchServe's 404 (a missing one
    its 400)."""
    url = params.text("url", required=True, empty_ok=True) or ""
    if not url:
        raise ModelNotFound("empty url")
    return RegisterRequest(
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


async def register(service: FerryService, params: Params) -> Response:
    registered = await service.register(_registration(params))
    name, version = registered.model.name, registered.model.version
    workers = registered.workers
    if not registered.ready:
        return _status("Processing worker updates...", 202)
    message = f'Model "{name}" Version: {version} registered with {workers} initial workers'
    if workers == 0:
        message += ". Use scale workers API to add workers for the model."
    return _status(message)


async def describe(
    service: FerryService, name: str, version: str | None, params: Params
) -> Response:
    """Describe; with ``customized=true`` the handler's ``describe_handle`` answer too."""
    document = described(service, name, version)
    if params.flag("customized", default=False) and version != "all":
        metadata = await service.customized_metadata(name, version)
        add_customized(document, metadata)
    return _json(document)


async def change(service: FerryService, name: str, version: str | None, params: Params) -> Response:
    """``PUT /models/M[/V]``: Ferry's batch policy switch (``batch_policy=``), or scale."""
    policy = params.text("batch_policy")
    if policy is None:
        return await scale(service, name, version, params)
    ref = service.set_batch_policy(name, version, policy, _policy_options(params))
    return _status(f"Batch policy of model {ref.name} set to {policy}")


def _policy_options(params: Params) -> dict[str, Any]:
    """The batch policies' options the call sets (``latency_objective_ms=``), by their
    model-config.yaml keys, read as model-config.yaml's are."""
    options: dict[str, Any] = {}
    for option in BATCH_POLICIES.options():
        text = params.text(option.param)
        if text is None:
            continue
        try:
            options[option.key] = read_policy_option(option, text, f"Parameter {option.param}")
        except ModelConfigError as error:
            raise InvalidRequest(str(error)) from None
    return options


def management_app(service: FerryService, workflows: WorkflowManager) -> Starlette:
    record = service.metrics.response_recorder("management")

    async def list_or_register(request: Request) -> Response:
        params = await Params.read(request, MAX_PARAMS_BODY)
        if request.method == "GET":
            return await list_models(service, params)
        return await register(service, params)

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]
        version = request.path_params.get("version")
        params = await Params.read(request, MAX_PARAMS_BODY)
        if request.method == "GET":
            return await describe(service, name, version, params)
        if request.method == "DELETE":
            await service.unregister(name, version)
            return _status(f'Model "{name}" unregistered')
        return await change(service, name, version, params)

    async def set_default(request: Request) -> Response:
        name, version = request.path_params["name"], request.path_params["version"]
        service.set_default(name, version)
        return _status(f'Default version successfully updated for model "{name}" to "{version}"')

    one_model_methods = ["GET", "PUT", "DELETE"]
    routes = [
        Route("/models", guarded(list_or_register, record), methods=["GET", "POST"]),
        Route("/models/{name}", guarded(one_model, record), methods=one_model_methods),
        Route("/models/{name}/{version}", guarded(one_model, record), methods=one_model_methods),
        Route(
            "/models/{name}/{version}/set-default", guarded(set_default, record), methods=["PUT"]
        ),
        *workflow_management_routes(workflows, record),
        *description_routes(management_description()),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers(record))
