"""Token authorization on the gRPC APIs: metadata ``authorization: Bearer <key>``,
compared in constant time.

The same rule as the HTTP APIs (``ferry.http.auth``): the management key always when keys
are on, the inference key when the inference API listens beyond loopback, and ``Ping``
open like ``/ping``. Loading and unloading models are management operations on every
transport, so the Open Inference Protocol's model repository calls on the inference port
need the management key (``ferry.grpc.listener`` gives each method its key). A call
without the right key ends as TorchServe ends it: with PERMISSION_DENIED, before its
handler runs.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable, Mapping
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
    """Refuses every call whose bearer key is not the one its method needs: its entry in
    ``by_method`` (full method paths, ``/package.Service/Method``), else ``key``; a method
    whose key is None is open.

        TokenAuth(keys.inference, {PING: None, LOAD: keys.management})
    """

    def __init__(self, key: str | None, by_method: Mapping[str, str | None] | None = None) -> None:
        self._expected = _encoded(key)
        self._by_method = {method: _encoded(k) for method, k in (by_method or {}).items()}

    def allows(self, details: grpc.HandlerCallDetails) -> bool:
        expected = self._by_method.get(details.method, self._expected)
        if expected is None:
            return True
        given = bearer_key(details.invocation_metadata)
        return given is not None and hmac.compare_digest(given.encode(), expected)

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or self.allows(handler_call_details):
            return handler
        return _denial_like(handler)


def _encoded(key: str | None) -> bytes | None:
    return None if key is None else key.encode()


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
