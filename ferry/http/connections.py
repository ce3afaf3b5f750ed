"""How a connection is used around an answer, as TorchServe uses it.

TorchServe (Netty's aggregator) reads a request's whole body before any handler sees it,
so its answer always follows the body; and it closes the connection after every answer
of status 400 or more (``NettyUtils.sendHttpResponse``). Ferry's endpoints answer some
requests without reading their body (404 for an unknown model, 401, 405), and uvicorn
keeps every connection alive. Together that stranded Postman's runtime (newman, issue
50): it stops feeding a file body once the answer has ended, which a fast 404 can do
before the client has noticed the end of its file, so the request is never finished and
the client holds the connection, and keeps running, until the server closes it.

So, as TorchServe: a body the app did not read is read (and dropped) before its answer
goes, and an error answer to a request whose body was all received closes the
connection. Not read first: a body declared over ``limit`` (its 413 goes at once, and the
connection discards the rest, as Netty's does) and one the client sends only on
``100 Continue``; their error answers leave the connection open, since closing while the
client still sends would reset it and could lose the answer.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def torchserve_connections(app: ASGIApp, limit: int) -> ASGIApp:
    """``app``, whose answers wait for the rest of a body it did not read (up to ``limit``
    bytes in all), and whose error answers then close their connection."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        received = 0  # body bytes handed out so far
        done = False  # the body's last message (or the disconnect) has been handed out

        async def tracking_receive() -> Message:
            nonlocal received, done
            message = await receive()
            received += len(message.get("body", b""))
            done = done or not message.get("more_body", False)
            return message

        async def send_after_body(message: Message) -> None:
            if message["type"] == "http.response.start":
                if not done and _may_read_rest(scope, limit):
                    while not done and received <= limit:
                        await tracking_receive()
                if done and message["status"] >= 400:
                    message = closing(message)
            await send(message)

        await app(scope, tracking_receive, send_after_body)

    return serve


def closing(start: Message) -> Message:
    """A ``http.response.start`` message whose answer closes the connection."""
    headers = [(name, value) for name, value in start.get("headers", []) if name != b"connection"]
    return {**start, "headers": [*headers, (b"connection", b"close")]}


def _may_read_rest(scope: Scope, limit: int) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            return False
        if name == b"expect" and value.lower() == b"100-continue":
            return False
    return True


__all__ = ["closing", "torchserve_connections"]
