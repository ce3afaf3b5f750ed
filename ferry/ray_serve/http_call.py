"""An HTTP request and its answer as plain data, and running one through an ASGI app in
process: how the router hands a request to a model's replica across Ray (both ends
pickle these), and how the replica answers it with Ferry's own inference API. Ray's
ingress hands a deployment a Starlette request and takes a Starlette response back:
``call_of`` and ``response_of`` convert."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message

from ferry.errors import RequestTooLarge
from ferry.http.errors import error_response
from ferry.http.request_body import read_limited

Headers = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True)
class HttpCall:
    method: str
    path: str
    query: bytes
    headers: Headers
    body: bytes


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: Headers
    body: bytes


async def call_of(request: Request, limit: int) -> HttpCall:
    """The request Ray's ingress handed over, as plain data: its body read whole, unless
    it passes ``limit`` bytes (``RequestTooLarge``, before the rest is read)."""
    return HttpCall(
        request.method,
        request.url.path,
        request.url.query.encode(),
        tuple((key.lower(), value) for key, value in request.headers.raw),
        await read_limited(request, limit),
    )


async def answer_ingress(
    request: Request, limit: int, answer: Callable[[HttpCall], Awaitable[HttpAnswer]]
) -> Response:
    """Ray's ingress request answered by ``answer`` as an ``HttpCall``; a body over
    ``limit`` bytes (``max_request_size``) gets TorchServe's 413 without reaching it."""
    try:
        call = await call_of(request, limit)
    except RequestTooLarge as error:
        return error_response(error)
    return response_of(await answer(call))


def response_of(answer: HttpAnswer) -> Response:
    """The answer as the response Ray's ingress sends (its length set anew)."""
    headers = {k.decode(): v.decode() for k, v in answer.headers if k != b"content-length"}
    return Response(answer.body, status_code=answer.status, headers=headers)


async def call_asgi(app: ASGIApp, call: HttpCall, client: tuple[str, int]) -> HttpAnswer:
    """``call`` through ``app`` as one HTTP/1.1 request; a streamed answer is joined."""
    exchange = _Exchange(call.body)
    await app(_scope(call, client), exchange.receive, exchange.send)
    return HttpAnswer(exchange.status, exchange.headers, b"".join(exchange.chunks))


def _scope(call: HttpCall, client: tuple[str, int]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": call.method,
        "scheme": "http",
        "path": call.path,
        "raw_path": call.path.encode(),
        "query_string": call.query,
        "root_path": "",
        "headers": list(call.headers),
        "client": client,
        "server": ("ray-serve", 0),
    }


class _Exchange:
    """The request's body, given once (then a disconnect), and the answer as it is sent."""

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body
        self.status = 500
        self.headers: Headers = ()
        self.chunks: list[bytes] = []

    async def receive(self) -> Message:
        if self._body is None:
            return {"type": "http.disconnect"}
        body, self._body = self._body, None
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.chunks.append(bytes(message.get("body", b"")))
