"""An HTTP request and its answer as plain data, and running one through an ASGI app in
process: how the router hands a request to a model's replica across Ray (both ends
pickle these), and how the replica answers it with Ferry's own inference API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message

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


async def call_asgi(app: ASGIApp, call: HttpCall, client: tuple[str, int]) -> HttpAnswer:
    """``call`` through ``app`` as one HTTP/1.1 request; a streamed answer is joined."""
    scope: dict[str, Any] = {
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
    sent_body = False

    async def receive() -> Message:
        nonlocal sent_body
        if sent_body:
            return {"type": "http.disconnect"}
        sent_body = True
        return {"type": "http.request", "body": call.body, "more_body": False}

    status: int = 500
    headers: Headers = ()
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    return HttpAnswer(status, headers, b"".join(chunks))
