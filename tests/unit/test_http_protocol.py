"""The listener's HTTP protocol, driven without sockets: a fake transport and a loop whose
clock moves only when a test says so."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from uvicorn.server import ServerState

from ferry.http.protocol import LINGER_SECONDS, HttpLimits, LimitedConfig, LimitedHttpProtocol

LIMITS = HttpLimits(max_header_size=1024, max_headers=10, header_timeout=5, body_read_timeout=7)


class ManualClockLoop(asyncio.SelectorEventLoop):
    """A real event loop whose clock moves only by ``advance``: timers fire when a test
    says, and the app's tasks run between the test's steps (``settle``)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def settle(self) -> None:
        """Run what is ready (the app's tasks, timers due), never waiting."""
        for _ in range(50):
            self.run_until_complete(asyncio.sleep(0))

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.settle()


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False
        self.eof_written = False

    def get_extra_info(self, name: str) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(name)

    def write(self, data: bytes) -> None:
        assert not self.eof_written, "write after write_eof"
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def status(self) -> int:
        return int(self.written.split(b" ", 2)[1])

    def error(self) -> dict[str, Any]:
        head, _, body = self.written.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head and b"connection: close" in head
        document: dict[str, Any] = json.loads(body)
        return document


async def ok_app(scope: Any, receive: Any, send: Any) -> None:
    """Answers without reading the body."""
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


async def reading_app(scope: Any, receive: Any, send: Any) -> None:
    """Waits for the whole body (as Ferry's endpoints do) before answering."""
    while (await receive()).get("more_body"):
        pass
    await ok_app(scope, receive, send)


class Connection:
    def __init__(self, app: Any, limits: HttpLimits = LIMITS) -> None:
        self.loop = ManualClockLoop()
        self.transport = Transport()
        config = LimitedConfig(
            app, limits=limits, lifespan="off", log_level="critical", timeout_keep_alive=75
        )
        self.protocol = LimitedHttpProtocol(config, ServerState(), {}, self.loop)
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]

    def send(self, *pieces: bytes) -> None:
        for piece in pieces:
            self.protocol.data_received(piece)
            self.loop.settle()

    def close(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.loop.settle()
        self.loop.close()


@pytest.fixture
def connect() -> Iterator[Callable[..., Connection]]:
    """``connect(app=ok_app)``: a connection to ``app`` within ``LIMITS``."""
    made: list[Connection] = []

    def make(app: Any = ok_app) -> Connection:
        made.append(Connection(app))
        return made[-1]

    yield make
    for conn in made:
        conn.close()


def head(extra: bytes = b"", target: bytes = b"/ping") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n"


Connect = Callable[..., Connection]


def test_a_head_within_the_limit_is_served(connect: Connect) -> None:
    conn = connect()
    request = head(b"X-Pad: " + b"a" * (1024 - len(head(b"X-Pad: \r\n"))) + b"\r\n")
    assert len(request) == 1024
    conn.send(request[:100], request[100:])
    assert conn.transport.status() == 200


def test_a_head_over_the_limit_gets_431_and_no_more_is_parsed(connect: Connect) -> None:
    conn = connect()
    conn.send(b"GET /ping HTTP/1.1\r\nX-Big: ")
    for _ in range(1000):  # 1 MB in all; the parser sees at most the first 1024 bytes
        conn.send(b"a" * 1000)
    assert conn.protocol._head_bytes == 1024
    assert conn.transport.status() == 431
    assert conn.transport.error()["type"] == "RequestHeaderFieldsTooLargeException"
    assert conn.transport.eof_written and not conn.transport.closed
    conn.loop.advance(LINGER_SECONDS)  # the lingering close ends
    assert conn.transport.closed


def test_one_read_holding_a_small_head_and_a_large_body_is_not_refused(connect: Connect) -> None:
    conn = connect(reading_app)
    conn.send(b"POST /p HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + b"b" * 5000)
    assert conn.transport.status() == 200


def test_pipelined_requests_in_one_read_are_each_within_the_limit(connect: Connect) -> None:
    conn = connect()
    conn.send(head() * 30)  # 30 small heads, 3x the limit in one read
    assert conn.transport.written.count(b"HTTP/1.1 200 OK") == 30


def test_too_many_header_fields_get_431(connect: Connect) -> None:
    conn = connect()
    conn.send(head(b"".join(b"X-%d: 1\r\n" % i for i in range(11))))
    assert conn.transport.status() == 431
    assert "10 header fields" in conn.transport.error()["message"]


def test_oversized_chunked_trailers_get_431(connect: Connect) -> None:
    conn = connect(reading_app)
    conn.send(b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: ")
    for _ in range(10):
        conn.send(b"t" * 500)
    assert conn.transport.status() == 431


def test_chunks_split_across_reads_are_not_taken_for_trailers(connect: Connect) -> None:
    conn = connect(reading_app)
    conn.send(b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(20):  # each chunk's size line and its data in separate reads
        conn.send(b"3e8\r\n", b"c" * 1000 + b"\r\n")
    conn.send(b"0\r\n\r\n")
    assert conn.transport.status() == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"HELLO\r\n\r\n",
        b"G@T / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET http://[::1 HTTP/1.1\r\n\r\n",  # httptools' URL parser fails in a callback
        b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /p HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ],
)
def test_malformed_requests_get_400_json(connect: Connect, request_bytes: bytes) -> None:
    conn = connect(reading_app)
    conn.send(request_bytes)
    assert conn.transport.status() == 400
    assert conn.transport.error()["type"] == "BadRequestException"


def test_a_head_not_done_in_time_gets_408_however_it_dribbles(connect: Connect) -> None:
    conn = connect()
    conn.send(head())
    conn.transport.written = b""
    conn.loop.advance(30)  # idle between requests is the keep-alive timeout's business
    conn.send(b"GET /ping HTTP/1.1\r\n")  # the next head's clock starts here
    for _ in range(4):
        conn.loop.advance(1)
        conn.send(b"X: 1\r\n")
    assert conn.transport.written == b""
    conn.loop.advance(1)
    assert conn.transport.status() == 408
    assert conn.transport.error()["type"] == "RequestTimeoutException"


def test_the_first_head_is_timed_from_the_connection_start(connect: Connect) -> None:
    conn = connect()
    conn.loop.advance(4)
    conn.send(b"GET /ping HTTP/1.1\r\n")
    conn.loop.advance(1)
    assert conn.transport.status() == 408


def test_a_connection_that_sends_nothing_is_closed_silently(connect: Connect) -> None:
    conn = connect()
    conn.loop.advance(4.9)
    assert not conn.transport.closed
    conn.loop.advance(0.1)
    assert conn.transport.closed and conn.transport.written == b""


def test_an_idle_keep_alive_connection_is_left_to_the_keep_alive_timeout(
    connect: Connect,
) -> None:
    conn = connect()
    conn.send(head())
    assert conn.transport.status() == 200
    conn.loop.advance(60)  # past the head timeout, short of uvicorn's 75 s keep-alive
    assert not conn.transport.closed
    conn.loop.advance(15)
    assert conn.transport.closed


def test_a_body_that_stops_coming_gets_408(connect: Connect) -> None:
    conn = connect(reading_app)
    conn.send(b"POST /p HTTP/1.1\r\nContent-Length: 1000\r\n\r\n0123456789")
    for _ in range(5):  # progress keeps it going
        conn.loop.advance(6)
        conn.send(b"x" * 10)
    conn.loop.advance(6.9)
    assert conn.transport.written == b""
    conn.loop.advance(0.1)
    assert conn.transport.status() == 408
    assert "no data for 7s" in conn.transport.error()["message"]
    assert conn.transport.written.count(b"HTTP/1.1") == 1  # the app's answer went nowhere


def test_time_the_server_is_not_reading_does_not_count_against_the_body(
    connect: Connect,
) -> None:
    conn = connect(reading_app)
    conn.send(b"POST /p HTTP/1.1\r\nContent-Length: 1000\r\n\r\n")
    conn.protocol.flow.pause_reading()
    conn.loop.advance(30)
    conn.protocol.flow.resume_reading()
    conn.loop.advance(6)
    assert conn.transport.written == b""
    conn.loop.advance(1)
    assert conn.transport.status() == 408


def test_a_body_after_the_answer_is_not_answered_twice(connect: Connect) -> None:
    conn = connect(ok_app)  # answers before the body came
    conn.send(b"POST /p HTTP/1.1\r\nContent-Length: 1000\r\n\r\n")
    assert conn.transport.status() == 200
    conn.loop.advance(7)
    assert conn.transport.closed and conn.transport.written.count(b"HTTP/1.1") == 1


def test_a_body_that_ends_after_the_answer_leaves_the_connection_to_the_keep_alive_timeout(
    connect: Connect,
) -> None:
    """The answer went first, the rest of the body came after (newman's upload to an
    unknown model): the connection must still close when idle, not stay open for ever."""
    conn = connect(ok_app)
    conn.send(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 400)
    assert conn.transport.status() == 200
    conn.loop.advance(1)
    conn.send(b"x" * 600)  # the body ends; uvicorn cancelled its keep-alive timer on this read
    conn.loop.advance(74)
    assert not conn.transport.closed
    conn.loop.advance(1)
    assert conn.transport.closed and conn.transport.written.count(b"HTTP/1.1") == 1
