"""``torchserve_connections`` driven as an ASGI app, with scripted body messages."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message

from ferry.http.connections import torchserve_connections


async def not_found(scope: Any, receive: Any, send: Any) -> None:
    """Answers 404 without reading the body, as the router does for an unknown path."""
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def serve(
    app: Any, chunks: list[Message], headers: list[tuple[bytes, bytes]], limit: int = 100
) -> tuple[int, list[Message]]:
    """How many body messages the app's wrapper read, and what it sent."""
    pending = list(chunks)
    sent: list[Message] = []

    async def receive() -> Message:
        return pending.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}

    async def run() -> None:
        await torchserve_connections(app, limit)(scope, receive, send)

    asyncio.run(run())
    return len(chunks) - len(pending), sent


def body(size: int, more: bool = True) -> Message:
    return {"type": "http.request", "body": b"x" * size, "more_body": more}


def connection(start: Message) -> bytes | None:
    return dict(start["headers"]).get(b"connection")


def test_an_unread_chunked_body_is_read_before_the_error_answer_which_closes() -> None:
    read, sent = serve(not_found, [body(30), body(30), body(0, more=False)], [])
    assert read == 3 and sent[0]["status"] == 404 and connection(sent[0]) == b"close"


def test_no_more_than_the_limit_is_read_for_an_answer_and_the_connection_stays() -> None:
    """Past ``limit`` the answer goes (the connection discards the rest): closing it under
    a client still sending would reset it."""
    read, sent = serve(not_found, [body(60), body(60), body(60), body(0, more=False)], [])
    assert read == 2 and connection(sent[0]) is None


def test_a_disconnect_ends_the_wait() -> None:
    read, sent = serve(not_found, [body(10), {"type": "http.disconnect"}], [])
    assert read == 2 and sent[0]["status"] == 404


def test_a_declared_length_over_the_limit_is_not_waited_for() -> None:
    read, sent = serve(not_found, [body(10)], [(b"content-length", b"101")])
    assert read == 0 and connection(sent[0]) is None


def test_a_success_keeps_the_connection() -> None:
    read, sent = serve(ok, [body(0, more=False)], [])
    assert read == 1 and connection(sent[0]) is None
