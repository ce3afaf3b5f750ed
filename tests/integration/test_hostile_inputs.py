"""What a hostile or broken client sends to the management API: manifests that point out of
their archive, bodies over the limit, remote archives that fail to register."""

from __future__ import annotations

import functools
import http.server
import json
import socket
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fixtures.models import broken_archive, digest_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server

MAX_PARAMS_BODY = 1 << 20
OUTSIDE_MODEL = "import pathlib\n\npathlib.Path(__file__).with_suffix('.ran').touch()\n"


@dataclass
class Hostile:
    server: RunningServer
    store: Path
    served: Path
    """What ``archive_url`` serves."""
    archive_url: str
    outside: Path
    """A model file beside the store; importing it leaves ``outside.ran``."""

    def register(self, url: str, synchronous: bool = True) -> httpx.Response:
        params: dict[str, str | int] = {"url": url, "initial_workers": 1}
        params["synchronous"] = str(synchronous).lower()
        with self.server.management() as api:
            return api.post("/models", params=params)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    """Model API on, ``resident`` loaded at start, remote archives allowed from a local
    server; the store holds archives whose manifests name files outside them."""
    tmp = tmp_path_factory.mktemp("hostile")
    store, served = tmp / "store", tmp / "served"
    store.mkdir()
    served.mkdir()
    outside = tmp / "outside_model.py"
    outside.write_text(OUTSIDE_MODEL)
    digest_archive(store, "resident")
    _mar(store / "absolute_model_file.mar", modelFile=str(outside))
    _mar(store / "escaping_weights.mar", serializedFile="../../../../../etc/passwd")
    handler = functools.partial(_QuietHandler, directory=str(served))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as archives:
        thread = threading.Thread(target=archives.serve_forever, daemon=True)
        thread.start()
        allowed = ["--enable-model-api", "--allowed-urls", r"http://127\.0\.0\.1:\d+/.*"]
        try:
            with ferry_server(store, ["resident=resident.mar"], tmp, *allowed) as server:
                url = f"http://127.0.0.1:{archives.server_address[1]}"
                yield Hostile(server, store, served, url, outside)
        finally:
            archives.shutdown()
            thread.join()


def _mar(path: Path, **model: str) -> str:
    """A .mar whose handler is the built-in base handler (it loads modelFile and
    serializedFile) and whose manifest has ``model``'s keys."""
    model = {"modelName": path.stem, "handler": "base_handler", **model}
    manifest = {"runtime": "python", "model": model}
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    return path.name


# --- manifest paths -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("archive", "key"),
    [("absolute_model_file.mar", "modelFile"), ("escaping_weights.mar", "serializedFile")],
)
def test_an_archive_whose_manifest_points_outside_it_is_refused(
    hostile: Hostile, archive: str, key: str
) -> None:
    message = assert_error(hostile.register(archive), 400, "InvalidModelException")
    assert f"manifest model.{key} " in message and "is outside the model folder" in message
    assert not hostile.outside.with_suffix(".ran").exists()


# --- body limit -----------------------------------------------------------------------------


def test_a_chunked_management_body_over_the_limit_is_413(hostile: Hostile) -> None:
    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit applies while streaming
        yield b'{"url": "'
        for _ in range(32):
            yield b"x" * (1 << 16)
        yield b'"}'

    with hostile.server.management() as api:
        response = api.post("/models", content=chunked())
        assert "exceeds" in assert_error(response, 413, "RequestEntityTooLargeException")
        assert api.get("/models").status_code == 200  # still up


def test_a_declared_body_over_the_limit_is_413_before_it_is_sent(hostile: Hostile) -> None:
    """The header alone decides: the answer comes while most of the body is still unsent
    (the socket timeout bounds the wait if the server waited for it instead)."""
    address = urlsplit(hostile.server.management_url)
    head = (
        "POST /models HTTP/1.1\r\n"
        f"Host: {address.netloc}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {300 * MAX_PARAMS_BODY}\r\n\r\n"
    )
    assert address.hostname is not None and address.port is not None
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(head.encode() + b'{"url": "')
        status_line, _, body = _read_response(sock).partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413 "), status_line
    assert b'"RequestEntityTooLargeException"' in body
    with hostile.server.management() as api:
        assert api.get("/models").status_code == 200


def _read_response(sock: socket.socket) -> bytes:
    """One HTTP response with a Content-Length, read whole."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += _recv(sock)
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += _recv(sock)
    return head + b"\r\n\r\n" + body


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        pytest.fail("the server closed the connection without a complete answer")
    return chunk


# --- failed remote registrations ------------------------------------------------------------


def _junk(served: Path) -> str:
    (served / "junk.mar").write_bytes(b"not a zip")
    return "junk.mar"


def _escaping(served: Path) -> str:
    return _mar(served / "escaping.mar", modelFile="../../outside_model.py")


def _invalid_config(served: Path) -> str:
    return digest_archive(served, "invalid_config", batchSize="lots")


def _already_registered(served: Path) -> str:
    return digest_archive(served, "resident", file_stem="already_registered")


def _unloadable(served: Path) -> str:
    return broken_archive(served)


@pytest.mark.parametrize(
    ("serve", "status"),
    [
        pytest.param(_junk, 400, id="not-a-zip"),
        pytest.param(_escaping, 400, id="manifest-outside"),
        pytest.param(_invalid_config, 400, id="invalid-config"),
        pytest.param(_already_registered, 409, id="already-exists"),
        pytest.param(_unloadable, 500, id="cannot-load"),
    ],
)
def test_a_failed_remote_registration_leaves_nothing_in_the_store(
    hostile: Hostile, serve: Callable[[Path], str], status: int
) -> None:
    name = serve(hostile.served)
    response = hostile.register(f"{hostile.archive_url}/{name}")
    assert response.status_code == status, response.text
    assert not (hostile.store / name).exists()


def test_an_asynchronous_registration_that_cannot_load_leaves_nothing(hostile: Hostile) -> None:
    name = "unloadable_async.mar"
    (hostile.served / broken_archive(hostile.served)).rename(hostile.served / name)
    response = hostile.register(f"{hostile.archive_url}/{name}", synchronous=False)
    assert response.status_code == 202, response.text
    wait_until(
        f"{name} to leave the store",
        lambda: not (hostile.store / name).exists(),
        process=hostile.server.process,
        log=hostile.server.log_path,
    )


def test_a_remote_archive_fixed_after_a_failed_registration_registers(hostile: Hostile) -> None:
    url = f"{hostile.archive_url}/retried.mar"
    (hostile.served / "retried.mar").write_bytes(b"truncated")
    assert_error(hostile.register(url), 400, "InvalidModelException")
    digest_archive(hostile.served, "retried")
    response = hostile.register(url)
    assert response.status_code == 200, response.text
    with hostile.server.management() as api:
        assert api.delete("/models/retried").status_code == 200
