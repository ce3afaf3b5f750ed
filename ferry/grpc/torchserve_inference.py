"""TorchServe's gRPC inference API (``org.pytorch.serve.grpc.inference.InferenceAPIsService``):
``Ping``, ``Predictions`` and ``StreamPredictions`` over ``FerryService``.

A request's ``input`` map becomes the handler's request, one part per key with no content
type (so the handler gets each value as bytes, as from TorchServe's gRPC API); its
metadata becomes the request headers (``x-request-id`` included), less ``authorization``.
``StreamPredictions`` answers one message per part the handler streams
(``send_intermediate_predict_response``), then one for its last answer.
``StreamPredictions2`` carries stateful sequences (``sequenceBatching``): each message is
a request of the sequence its ``sequence_id`` names, answered on the stream in the order
the messages came, each answer with its ``sequence_id``; a failed request is answered
with a ``status`` and the stream goes on, as TorchServe does. Unlike TorchServe, which
answers "Parameter sequenceId is required.", a message without ``sequence_id`` continues
the stream's sequence (the one its first message began, named by the server if it had
none); an ``input`` entry ``ts_request_sequence_end: true`` marks its client's last
request of the sequence.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Never

from google.protobuf import empty_pb2
from grpc import StatusCode, aio

from ferry.apis import Apis
from ferry.echo import capped_message
from ferry.errors import FerryError, InvalidRequest
from ferry.grpc.calls import on_hang_up, request_headers
from ferry.grpc.errors import PREDICTION_CODES, error_code
from ferry.grpc.generated import ferry_torchserve_inference_pb2 as pb
from ferry.grpc.generated import ferry_torchserve_inference_pb2_grpc as pb_grpc
from ferry.handlers.contract.context import SEQUENCE_END_HEADER, SEQUENCE_ID_HEADER
from ferry.service import FerryService
from ferry.service.stream import AnswerStream, Failed, is_last
from ferry.service.types import InputPart, PredictionRequest

SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
PING = f"/{SERVICE}/Ping"
"""Open without a key, like ``/ping``."""

if TYPE_CHECKING:  # generic only in the stubs
    Context = aio.ServicerContext[Any, Any]


def request_parts(request: pb.PredictionsRequest) -> list[InputPart]:
    """One part per ``input`` entry, named by its key; no content type, so raw bytes."""
    return [InputPart(name, "", bytes(data)) for name, data in request.input.items()]


async def _fail(context: Context, error: FerryError) -> Never:
    await context.abort(error_code(error, PREDICTION_CODES), capped_message(error.message))


class _SequenceAnswer:
    """What one ``StreamPredictions2`` message is answered with: the parts its handler
    streams, then its answer or error, in the order they come."""

    def __init__(self, sequence_id: str, max_pending_bytes: int) -> None:
        self.sequence_id = sequence_id
        self.stream = AnswerStream(max_pending_bytes)

    def fail(self, error: FerryError) -> _SequenceAnswer:
        self.stream.fail(error)
        return self

    async def responses(self) -> AsyncIterator[pb.PredictionResponse]:
        while True:
            event = await self.stream.next()
            if isinstance(event, Failed):
                code = error_code(event.error, PREDICTION_CODES).value[0]
                response = pb.PredictionResponse(sequence_id=self.sequence_id)
                message = capped_message(event.error.message)
                response.status.code, response.status.message = code, message
                yield response
                return
            yield pb.PredictionResponse(prediction=event.body, sequence_id=self.sequence_id)
            if is_last(event):
                return


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
            admission = self._service.admit(model, version)
            prediction = PredictionRequest(
                request_parts(request), request_headers(context), on_hang_up(context)
            )
            answer = await self._service.predict(admission, prediction)
        except FerryError as error:
            await _fail(context, error)
        return pb.PredictionResponse(prediction=answer.body)

    async def StreamPredictions(
        self, request: pb.PredictionsRequest, context: Context
    ) -> AsyncIterator[pb.PredictionResponse]:
        model, version = await self._model(request, context)
        stream = AnswerStream(self._service.settings.max_response_size)
        try:
            admission = self._service.admit(model, version)
            prediction = PredictionRequest(
                request_parts(request),
                request_headers(context),
                on_hang_up(context),
                stream.on_part,
            )
            pending = self._service.submit(admission, prediction)
        except FerryError as error:
            await _fail(context, error)
        stream.watch(pending)
        try:
            while True:
                event = await stream.next()
                if isinstance(event, Failed):
                    await _fail(context, event.error)
                yield pb.PredictionResponse(prediction=event.body)
                if is_last(event):
                    return
        finally:
            pending.cancel()  # done already, or the client went away: stop waiting

    async def StreamPredictions2(
        self, request_iterator: AsyncIterator[pb.PredictionsRequest], context: Context
    ) -> AsyncIterator[pb.PredictionResponse]:
        """Each message's answers in the order the messages came; messages are queued as
        they arrive, so a client need not wait for one answer to send the next."""
        answers: asyncio.Queue[_SequenceAnswer | None] = asyncio.Queue()
        reader = asyncio.ensure_future(self._read_sequence(request_iterator, context, answers))
        try:
            while (answer := await answers.get()) is not None:
                async for response in answer.responses():
                    yield response
            await reader  # its errors (a broken stream) are the call's
        finally:
            if not reader.done():
                reader.cancel()

    async def _read_sequence(
        self,
        requests: AsyncIterator[pb.PredictionsRequest],
        context: Context,
        answers: asyncio.Queue[_SequenceAnswer | None],
    ) -> None:
        sequence = ""
        try:
            async for request in requests:
                answer = self._submit_in_sequence(request, context, sequence)
                sequence = answer.sequence_id or sequence
                answers.put_nowait(answer)
        finally:
            answers.put_nowait(None)

    def _submit_in_sequence(
        self, request: pb.PredictionsRequest, context: Context, sequence: str
    ) -> _SequenceAnswer:
        """Queue one message of a sequence: its ``sequence_id``, else the stream's."""
        sequence = request.sequence_id or sequence
        answer = _SequenceAnswer(sequence, self._service.settings.max_response_size)
        if not request.model_name:
            return answer.fail(InvalidRequest("Parameter model_name is required."))
        headers = request_headers(context)
        if sequence:
            headers[SEQUENCE_ID_HEADER] = sequence
        if request.input.get(SEQUENCE_END_HEADER, b"").strip().lower() == b"true":
            headers[SEQUENCE_END_HEADER] = "true"
        try:
            admission = self._service.admit(request.model_name, request.model_version or None)
            prediction = PredictionRequest(
                request_parts(request), headers, on_hang_up(context), answer.stream.on_part
            )
            pending = self._service.submit(admission, prediction)
        except FerryError as error:
            return answer.fail(error)
        answer.sequence_id = pending.sequence_id or sequence
        answer.stream.watch(pending)
        return answer

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
