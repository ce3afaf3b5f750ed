"""TorchServe's gRPC inference API (``org.pytorch.serve.grpc.inference.InferenceAPIsService``):
``Ping``, ``Predictions`` and ``StreamPredictions`` over ``FerryService``.

A request's ``input`` map becomes the handler's request, one part per key with no content
type (so the handler gets each value as bytes, as from TorchServe's gRPC API); its
metadata becomes the request headers (``x-request-id`` included), less ``authorization``.
``StreamPredictions`` answers one message per part the handler streams
(``send_intermediate_predict_response``), then one for its last answer.
``StreamPredictions2`` (TorchServe's stateful sequences) answers UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Never

from google.protobuf import empty_pb2
from grpc import StatusCode, aio

from ferry.apis import Apis
from ferry.errors import FerryError
from ferry.grpc.calls import on_hang_up, request_headers
from ferry.grpc.errors import PREDICTION_CODES, error_code
from ferry.grpc.generated import ferry_torchserve_inference_pb2 as pb
from ferry.grpc.generated import ferry_torchserve_inference_pb2_grpc as pb_grpc
from ferry.service import FerryService
from ferry.service.types import InputPart, Prediction, PredictionPart

SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
PING = f"/{SERVICE}/Ping"
"""Open without a key, like ``/ping``."""

if TYPE_CHECKING:  # generic only in the stubs
    Context = aio.ServicerContext[Any, Any]


def request_parts(request: pb.PredictionsRequest) -> list[InputPart]:
    """One part per ``input`` entry, named by its key; no content type, so raw bytes."""
    return [InputPart(name, "", bytes(data)) for name, data in request.input.items()]


async def _fail(context: Context, error: FerryError) -> Never:
    await context.abort(error_code(error, PREDICTION_CODES), error.message)


class TorchServeInference(pb_grpc.InferenceAPIsServiceServicer):
    def __init__(self, service: FerryService) -> None:
        self._service = service

    async def Ping(self, request: empty_pb2.Empty, context: Context) -> pb.TorchServeHealthResponse:
        """``{"status": "Healthy"}`` as TorchServe pretty-prints it; OK even when unhealthy."""
        status = self._service.health().status
        return pb.TorchServeHealthResponse(health=json.dumps({"status": status}, indent=2))

    async def Predictions(
        self, request: pb.PredictionsRequest, context: Context
    ) -> pb.PredictionResponse:
        model, version = await self._model(request, context)
        try:
            answer = await self._service.predict(
                model,
                version,
                request_parts(request),
                request_headers(context),
                on_hang_up(context),
            )
        except FerryError as error:
            await _fail(context, error)
        return pb.PredictionResponse(prediction=answer.body)

    async def StreamPredictions(
        self, request: pb.PredictionsRequest, context: Context
    ) -> AsyncIterator[pb.PredictionResponse]:
        model, version = await self._model(request, context)
        events: asyncio.Queue[PredictionPart | Prediction | FerryError] = asyncio.Queue()

        async def predict() -> None:
            try:
                answer = await self._service.predict(
                    model,
                    version,
                    request_parts(request),
                    request_headers(context),
                    on_hang_up(context),
                    events.put_nowait,
                )
            except FerryError as error:
                events.put_nowait(error)
            else:
                events.put_nowait(answer)

        task = asyncio.ensure_future(predict())
        try:
            while True:
                event = await events.get()
                if isinstance(event, FerryError):
                    await _fail(context, event)
                yield pb.PredictionResponse(prediction=event.body)
                if isinstance(event, Prediction):
                    return
        finally:
            if not task.done():  # the client went away: its job is failed by the hang-up
                task.cancel()

    async def StreamPredictions2(
        self, request_iterator: AsyncIterator[pb.PredictionsRequest], context: Context
    ) -> None:
        await context.abort(
            StatusCode.UNIMPLEMENTED,
            "StreamPredictions2 (stateful sequences) is not supported by Ferry; "
            "use Predictions or StreamPredictions",
        )

    async def _model(
        self, request: pb.PredictionsRequest, context: Context
    ) -> tuple[str, str | None]:
        if not request.model_name:  # TorchServe's code and words
            await context.abort(StatusCode.INTERNAL, "Parameter model_name is required.")
        return request.model_name, request.model_version or None


def add_to_server(server: aio.Server, apis: Apis) -> None:
    """Serve ``InferenceAPIsService`` on ``server``."""
    servicer = TorchServeInference(apis.service)
    pb_grpc.add_InferenceAPIsServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


__all__ = ["PING", "SERVICE", "TorchServeInference", "add_to_server", "request_parts"]
