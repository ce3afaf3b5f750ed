"""TorchServe's gRPC management API (``org.pytorch.serve.grpc.management.ManagementAPIsService``)
over ``FerryService``, with the REST API's semantics and words.

Every call answers a ``ManagementResponse``: ``DescribeModel`` and ``ListModels`` the REST
API's JSON body, the others its ``status`` text (as TorchServe's gRPC API does). proto3
cannot tell an unset field from 0 or "": as in TorchServe, a number of 0 or less and an
empty string mean "the default" (REST's defaults), and ``synchronous`` is false unless set.
``ListModels`` is the exception, as in TorchServe: its ``limit`` goes to the paging as
sent, so without one (0) the page is empty (TorchServe's proto promises 100; its
``ApiUtils.getModelList`` pages 0 models), and below 0 or above 100 it is 100.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Never

from grpc import aio

from ferry.apis import Apis
from ferry.echo import capped_message
from ferry.errors import FerryError, InvalidRequest
from ferry.grpc.errors import CUSTOMIZED_DESCRIBE_CODES, NO_OVERRIDES, Overrides, error_code
from ferry.grpc.generated import ferry_torchserve_management_pb2 as pb
from ferry.grpc.generated import ferry_torchserve_management_pb2_grpc as pb_grpc

# The describe document is TorchServe's REST one; it lives with the REST adapter for now.
from ferry.protocols.describe import add_customized, model_json
from ferry.service import FerryService
from ferry.service.types import RegisterRequest

if TYPE_CHECKING:  # generic only in the stubs
    Context = aio.ServicerContext[Any, Any]

PROCESSING = "Processing worker updates..."


def _positive(value: int) -> int | None:
    return value if value > 0 else None


def _text(value: str) -> str | None:
    return value or None


def register_request(request: pb.RegisterModelRequest) -> RegisterRequest:
    """The service's request; ``InvalidRequest`` without a ``url``."""
    if not request.url:
        raise InvalidRequest("Parameter url is required.")
    return RegisterRequest(
        url=request.url,
        model_name=_text(request.model_name),
        handler=_text(request.handler),
        runtime=_text(request.runtime),
        batch_size=_positive(request.batch_size),
        max_batch_delay_ms=_positive(request.max_batch_delay),
        initial_workers=_positive(request.initial_workers),
        synchronous=request.synchronous,
        response_timeout=_positive(request.response_timeout),
        startup_timeout=_positive(request.startup_timeout),
    )


def _reply(msg: str) -> pb.ManagementResponse:
    return pb.ManagementResponse(msg=msg)


def _json(document: Any) -> pb.ManagementResponse:
    return _reply(json.dumps(document, indent=2))


async def _fail(context: Context, error: FerryError, overrides: Overrides = NO_OVERRIDES) -> Never:
    await context.abort(error_code(error, overrides), capped_message(error.message))


class TorchServeManagement(pb_grpc.ManagementAPIsServiceServicer):
    def __init__(self, service: FerryService) -> None:
        self._service = service

    async def DescribeModel(
        self, request: pb.DescribeModelRequest, context: Context
    ) -> pb.ManagementResponse:
        name, version = request.model_name, request.model_version or None
        customized = request.customized and version != "all"
        try:
            described = [model_json(status) for status in self._service.describe(name, version)]
            if customized:
                add_customized(described, await self._service.customized_metadata(name, version))
        except FerryError as error:
            await _fail(context, error, CUSTOMIZED_DESCRIBE_CODES if customized else NO_OVERRIDES)
        return _json(described)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: Context
    ) -> pb.ManagementResponse:
        # limit 0 (unset) is an empty page, as TorchServe answers it (module docstring).
        page = self._service.list_models(request.limit, request.next_page_token)
        document: dict[str, Any] = {
            "models": [{"modelName": name, "modelUrl": url} for name, url in page.models]
        }
        if page.next_page_token is not None:
            document["nextPageToken"] = page.next_page_token
        return _json(document)

    async def RegisterModel(
        self, request: pb.RegisterModelRequest, context: Context
    ) -> pb.ManagementResponse:
        try:
            registered = await self._service.register(register_request(request))
        except FerryError as error:
            await _fail(context, error)
        if not registered.ready:
            return _reply(PROCESSING)
        name, version, workers = (
            registered.model.name,
            registered.model.version,
            registered.workers,
        )
        message = f'Model "{name}" Version: {version} registered with {workers} initial workers'
        if workers == 0:
            message += ". Use scale workers API to add workers for the model."
        return _reply(message)

    async def ScaleWorker(
        self, request: pb.ScaleWorkerRequest, context: Context
    ) -> pb.ManagementResponse:
        name, version = request.model_name, request.model_version or None
        min_worker = request.min_worker if request.min_worker > 0 else 1
        max_worker = request.max_worker if request.max_worker > 0 else min_worker
        try:
            scaled = await self._service.scale(
                name, version, min_worker, max_worker, request.synchronous
            )
        except FerryError as error:
            await _fail(context, error)
        if not request.synchronous:
            return _reply(PROCESSING)
        suffix = f", version: {version}" if version else ""
        return _reply(f"Workers scaled to {scaled.workers} for model: {name}{suffix}")

    async def SetDefault(
        self, request: pb.SetDefaultRequest, context: Context
    ) -> pb.ManagementResponse:
        name, version = request.model_name, request.model_version
        try:
            self._service.set_default(name, version)
        except FerryError as error:
            await _fail(context, error)
        return _reply(f'Default version successfully updated for model "{name}" to "{version}"')

    async def UnregisterModel(
        self, request: pb.UnregisterModelRequest, context: Context
    ) -> pb.ManagementResponse:
        name = request.model_name
        try:
            self._service.require_model_api()
            if not name:
                raise InvalidRequest("Parameter model_name is required.")
            await self._service.unregister(name, request.model_version or None)
        except FerryError as error:
            await _fail(context, error)
        return _reply(f'Model "{name}" unregistered')


def add_to_server(server: aio.Server, apis: Apis) -> None:
    """Serve ``ManagementAPIsService`` on ``server``."""
    servicer = TorchServeManagement(apis.service)
    pb_grpc.add_ManagementAPIsServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


__all__ = ["TorchServeManagement", "add_to_server", "register_request"]
