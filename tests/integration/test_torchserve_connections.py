"""Connections used as TorchServe uses them (``ferry.http.connections``): an answer to a
request whose body the endpoint never reads (404 for an unknown model) leaves only once
the whole body has arrived, and an error answer closes its connection. Without both,
newman (Postman's runtime) ran TorchServe's inference collection and then held two
connections open and kept running for minutes (issue 50).

Raw sockets, so that the test controls when each part of the body is sent; their timeout
is only a hang guard.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.raw_http import closed, connect, nothing_arrives, read_answer, request_head
from tests.fixtures.server import RunningServer, ferry_server

MAX_REQUEST_SIZE = 512 * 1024
BODY = b"\xff\xd8" + b"j" * (300 * 1024 - 2)  # a photo's size, under MAX_REQUEST_SIZE


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("connections")
    store = tmp / "store"
    store.mkdir()
    with ferry_server(store, [], tmp, "--max-request-size", str(MAX_REQUEST_SIZE)) as running:
        yield running


def test_an_unread_body_is_received_before_the_error_answer_which_closes(
    server: RunningServer,
) -> None:
    with connect(server.url) as sock:
        half = len(BODY) // 2
        sock.sendall(request_head("POST", "/predictions/absent", len(BODY)) + BODY[:half])
        assert nothing_arrives(sock), "answered while the client was still sending its body"
        sock.sendall(BODY[half:])
        status, head, body = read_answer(sock)
        assert status == 404 and b"ModelNotFoundException" in body
        assert b"connection: close" in head.lower()  # TorchServe's, after every error
        assert closed(sock)


def test_every_listener_answers_after_the_body(server: RunningServer) -> None:
    """A path no route serves: 404 from the router itself, on the management API here."""
    with connect(server.management_url) as sock:
        sock.sendall(request_head("POST", "/no-such-route", len(BODY)) + BODY[:1000])
        assert nothing_arrives(sock)
        sock.sendall(BODY[1000:])
        assert read_answer(sock)[0] == 404
        assert closed(sock)


def test_a_success_keeps_the_connection(server: RunningServer) -> None:
    with connect(server.url) as sock:
        for _ in range(2):
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            status, head, _ = read_answer(sock)
            assert status == 200 and b"connection: close" not in head.lower()


@pytest.mark.parametrize(
    "extra",
    [(), ("Expect: 100-continue",)],
    ids=["over-max-request-size", "expect-100-continue"],
)
def test_a_body_not_worth_waiting_for_gets_its_answer_at_once(
    server: RunningServer, extra: tuple[str, ...]
) -> None:
    """A body over ``max_request_size`` (its 413 must not wait for it) or one the client
    sends only when told to: answered at once, and the connection is not closed under a
    client that may still be sending (that would reset it)."""
    length = MAX_REQUEST_SIZE + 1 if not extra else len(BODY)
    with connect(server.url) as sock:
        sock.sendall(request_head("POST", "/predictions/absent", length, *extra))
        status, head, _ = read_answer(sock)
        assert status == 404  # the model is looked up before the size is checked
        assert b"connection: close" not in head.lower()
