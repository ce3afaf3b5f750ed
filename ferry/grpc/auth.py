"""Token authorization on the gRPC APIs: metadata ``authorization: Bearer <key>``,
compared in constant time.

The same rule as the HTTP APIs (``ferry.http.auth``): the management key always when keys
are on, the inference key when the inference API listens beyond loopback, and ``Ping``
open like ``/ping``. A call without the right key ends as TorchServe ends it: with
PERMISSION_DENIED, before its handler runs.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio

DENIED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
"""TorchServe's words, so clients that match them keep working."""

_BEARER = re.compile(r"^Bearer\s+(\S+)$")

if TYPE_CHECKING:  # generic only in the stubs
    Handler = grpc.RpcMethodHandler[Any, Any]
    Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]


def bearer_key(metadata: Any) -> str | None:
    """The key in the ``authorization`` entry of a call's metadata (TorchServe's pattern)."""
    for key, value in metadata or ():
        if key.lower() == "authorization" and isinstance(value, str):
            found = _BEARER.match(value)
            return found.group(1) if found else None
    return None


class TokenAuth(aio.ServerInterceptor):
    """Refuses every call whose bearer key is not ``key``, except ``open_methods`` (full
    method paths, ``/package.Service/Method``)."""

    def __init__(self, key: str, open_methods: frozenset[str] = frozenset()) -> None:
        self._expected = key.encode()
        self._open = open_methods

    def allows(self, details: grpc.HandlerCallDetails) -> bool:
        if details.method in self._open:
            return True
        given = bearer_key(details.invocation_metadata)
        return given is not None and hmac.compare_digest(given.encode(), self._expected)

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or self.allows(handler_call_details):
            return handler
        return _denial_like(handler)


async def _deny(request: Any, context: aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, DENIED)


def _denial_like(handler: Handler) -> Handler:
    """A handler of the same kind (unary or streaming each way) that only refuses: a
    streaming call is refused at once, without waiting for a first message."""
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(_deny, handler.request_deserializer, handler.response_serializer)


__all__ = ["DENIED", "TokenAuth", "bearer_key"]
