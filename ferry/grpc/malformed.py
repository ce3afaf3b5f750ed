"""A request whose bytes are not a valid message for its method answers INVALID_ARGUMENT
("the request is not a valid ModelInferRequest message"), on every service.

gRPC decodes a request before the servicer runs, and when the decoder raises it answers
UNKNOWN with the exception's class in the details ("Unexpected <class
'google.protobuf.message.DecodeError'>...") and logs a traceback. ``MalformedRequests``
gives each method a decoder that returns a ``Malformed`` marker instead of raising, and a
behaviour that aborts on the marker before the servicer sees it. For a streamed request
the check is on each message as the servicer reads it.

Ferry's servicers are all asyncio ones (coroutines or async generators); the wrappers keep
each method's kind, which ``grpc.aio`` reads to decide how to call it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

if TYPE_CHECKING:  # generic only in the stubs
    Handler = grpc.RpcMethodHandler[Any, Any]
    Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]
    Context = aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class Malformed:
    """What the decoder returns for bytes that are not a valid message."""

    reason: str


def _tolerant(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    message = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    name = f"{message.name} message" if message is not None else "message"
    malformed = Malformed(f"the request is not a valid {name}")

    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError:
            return malformed

    return decode


async def _valid(request: Any, context: Context) -> Any:
    if isinstance(request, Malformed):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
    return request


async def _valid_each(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
    async for request in requests:
        yield await _valid(request, context)


def _checking(behaviour: Any, streamed_request: bool) -> Any:
    """``behaviour`` behind the check, of the same kind (coroutine or async generator)."""

    async def checked(request: Any, context: Context) -> Any:
        if streamed_request:
            return _valid_each(request, context)
        return await _valid(request, context)

    if inspect.isasyncgenfunction(behaviour):

        async def replies(request: Any, context: Context) -> AsyncIterator[Any]:
            request = await checked(request, context)
            # aclosing: a client that goes away closes the servicer's generator at once
            async with contextlib.aclosing(behaviour(request, context)) as answers:
                async for answer in answers:
                    yield answer

        return replies

    async def reply(request: Any, context: Context) -> Any:
        return await behaviour(await checked(request, context), context)

    return reply


def _checked(handler: Handler) -> Handler:
    streaming = (handler.request_streaming, handler.response_streaming)
    behaviour, make = {
        (False, False): (handler.unary_unary, grpc.unary_unary_rpc_method_handler),
        (False, True): (handler.unary_stream, grpc.unary_stream_rpc_method_handler),
        (True, False): (handler.stream_unary, grpc.stream_unary_rpc_method_handler),
        (True, True): (handler.stream_stream, grpc.stream_stream_rpc_method_handler),
    }[streaming]
    return make(
        _checking(behaviour, handler.request_streaming),
        _tolerant(handler.request_deserializer),  # type: ignore[arg-type]
        handler.response_serializer,
    )


class MalformedRequests(aio.ServerInterceptor):
    """Puts every method of the server behind the check; each method's checked handler is
    made once and reused."""

    def __init__(self) -> None:
        self._checked: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        made = self._checked.get(method)
        if made is None or made[0] is not handler:
            made = (handler, _checked(handler))
            self._checked[method] = made
        return made[1]


__all__ = ["Malformed", "MalformedRequests"]
