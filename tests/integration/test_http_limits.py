"""What every listener does with requests beyond the HTTP limits: an oversized head (431),
a malformed request (400), a head or body that does not come (408), a wrong method (405
with ``Allow``), each with TorchServe's JSON body; the connection is then closed.

Raw sockets send what an HTTP client would refuse to; their timeout is only a hang guard.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fixtures.models import digest_archive
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server

TIMEOUT_SECONDS = 2
"""The server's header and body timeouts in this module (short, so the tests are)."""
HANG_GUARD = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("limits")
    store = tmp / "store"
    store.mkdir()
    models = [f"echo={digest_archive(store, 'echo')}"]
    timeouts = ["--header-timeout", str(TIMEOUT_SECONDS)]
    timeouts += ["--body-read-timeout", str(TIMEOUT_SECONDS)]
    with ferry_server(store, models, tmp, *timeouts) as running:
        yield running


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.create_connection((parts.hostname, parts.port), timeout=HANG_GUARD)
    sock.settimeout(HANG_GUARD)
    return sock


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def parse(raw: bytes) -> httpx.Response:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = [(name, value) for name, _, value in (line.partition(": ") for line in lines)]
    return httpx.Response(int(status_line.split(" ")[1]), headers=headers, content=body)


def exchange(url: str, request: bytes) -> httpx.Response:
    """Send ``request`` on a fresh connection; the answer, once the server has closed."""
    with connect(url) as sock:
        sock.sendall(request)
        return parse(read_to_close(sock))


def big_head(path: str, header_bytes: int) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * header_bytes}\r\n\r\n".encode()


@pytest.mark.parametrize(
    ("api", "path"),
    [("url", "/ping"), ("management_url", "/models"), ("metrics_url", "/metrics")],
)
def test_a_head_over_64_kib_gets_431_on_every_listener(
    server: RunningServer, api: str, path: str
) -> None:
    url = getattr(server, api)
    response = exchange(url, big_head(path, 128 * 1024))
    assert_error(response, 431, "RequestHeaderFieldsTooLargeException")
    assert response.headers["connection"] == "close"
    assert httpx.get(f"{url}{path}", timeout=HANG_GUARD).status_code == 200
    assert httpx.get(f"{server.url}/ping", timeout=HANG_GUARD).status_code == 200


def test_a_head_within_the_limit_is_served(server: RunningServer) -> None:
    with connect(server.url) as sock:
        sock.sendall(big_head("/ping", 60 * 1024).replace(b"Host: x", b"Connection: close"))
        assert parse(read_to_close(sock)).status_code == 200


def test_over_100_header_fields_get_431(server: RunningServer) -> None:
    fields = "".join(f"X-Field-{index}: {index}\r\n" for index in range(200))
    response = exchange(server.url, f"GET /ping HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode())
    assert_error(response, 431, "RequestHeaderFieldsTooLargeException")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nBad Header: x\r\n\r\n",
        b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["request-line", "header", "chunked"],
)
def test_malformed_requests_get_400_json(server: RunningServer, request_bytes: bytes) -> None:
    response = exchange(server.url, request_bytes)
    assert_error(response, 400, "BadRequestException")


def test_405_names_the_allowed_methods(server: RunningServer) -> None:
    response = httpx.delete(f"{server.url}/ping", timeout=HANG_GUARD)
    assert_error(response, 405, "MethodNotAllowedException")
    assert "GET" in response.headers["allow"].split(", ")
    response = httpx.get(f"{server.url}/predictions/echo", timeout=HANG_GUARD)
    assert set(response.headers["allow"].split(", ")) == {"POST", "PUT"}


@pytest.mark.parametrize(
    ("api", "head"),
    [
        ("url", "POST /predictions/echo HTTP/1.1\r\n"),
        ("management_url", "POST /models HTTP/1.1\r\nContent-Type: application/json\r\n"),
    ],
)
def test_a_body_shorter_than_its_content_length_gets_408(
    server: RunningServer, api: str, head: str
) -> None:
    request = f"{head}Host: x\r\nContent-Length: 1000\r\n\r\n".encode() + b"0123456789"
    response = exchange(getattr(server, api), request)  # ends once the server closes
    assert_error(response, 408, "RequestTimeoutException")
    assert f"{TIMEOUT_SECONDS}s" in response.json()["message"]


def test_a_half_sent_head_gets_408_and_is_closed(server: RunningServer) -> None:
    response = exchange(server.url, b"GET /ping HTTP/1.1\r\nHost: x\r\n")
    assert_error(response, 408, "RequestTimeoutException")


def test_a_connection_that_sends_nothing_is_closed(server: RunningServer) -> None:
    with connect(server.url) as sock:
        assert read_to_close(sock) == b""


def test_inference_openapi_lists_401(server: RunningServer) -> None:
    """Token authorization applies to inference beyond loopback: its description says so."""
    description = httpx.get(f"{server.url}/api-description", timeout=HANG_GUARD).json()
    predict = description["paths"]["/predictions/{model_name}"]["post"]
    assert "401" in predict["responses"]
    assert "401" not in description["paths"]["/ping"]["get"]["responses"]


def test_the_limits_are_settings(tmp_path: Path) -> None:
    """``--max-header-size`` and ``--max-headers`` move the limits."""
    store = tmp_path / "store"
    store.mkdir()
    with ferry_server(store, [], tmp_path, "--max-header-size", "2048", "--max-headers", "5") as s:
        assert_error(
            exchange(s.url, big_head("/ping", 4096)), 431, "RequestHeaderFieldsTooLargeException"
        )
        fields = "".join(f"X-{index}: 1\r\n" for index in range(6))
        request = f"GET /ping HTTP/1.1\r\n{fields}\r\n".encode()
        assert_error(exchange(s.url, request), 431, "RequestHeaderFieldsTooLargeException")
