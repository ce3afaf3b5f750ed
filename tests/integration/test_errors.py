"""Every error status of the inference API, each with TorchServe's JSON body."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer


def test_unknown_model_and_version_are_404(main_server: RunningServer) -> None:
    with main_server.client() as client:
        assert_error(client.post("/predictions/nope", content=b"x"), 404, "ModelNotFoundException")
        assert_error(
            client.post("/predictions/digest/9.9", content=b"x"), 404, "ModelNotFoundException"
        )
        assert client.post("/predictions/digest/1.0", content=b"x").status_code == 200
        assert_error(client.get("/no/such/path"), 404, "ResourceNotFoundException")
        assert_error(client.get("/predictions/digest"), 405, "MethodNotAllowedException")


def test_body_over_max_request_size_is_413(strict_server: RunningServer) -> None:
    with strict_server.client() as client:
        response = client.post("/predictions/gated", content=b"x" * 100_001)
        assert_error(response, 413, "RequestEntityTooLargeException")

        def chunked() -> Iterator[bytes]:  # no Content-Length: the limit applies while streaming
            for _ in range(20):
                yield b"y" * 10_000

        assert_error(
            client.post("/predictions/gated", content=chunked()),
            413,
            "RequestEntityTooLargeException",
        )


def test_invalid_json_body_is_400(main_server: RunningServer) -> None:
    with main_server.client() as client:
        response = client.post(
            "/predictions/digest",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert_error(response, 400, "BadRequestException")


def test_model_that_cannot_load_gives_503_and_partial_ping(strict_server: RunningServer) -> None:
    """One broken model among working ones: TorchServe's rule says Partial Healthy (200),
    so it does not take the whole server out of a load balancer."""
    with strict_server.client() as client:
        message = assert_error(
            client.post("/predictions/broken", content=b"x"), 503, "ServiceUnavailableException"
        )
        assert "broken" in message and "this model cannot load" in message
        ping = client.get("/ping")
        assert ping.status_code == 200 and ping.json() == {"status": "Partial Healthy"}


def test_handler_errors_are_500_or_the_handlers_own_code(main_server: RunningServer) -> None:
    with main_server.client() as client:
        message = assert_error(
            client.post("/predictions/digest", content=b"fail"), 500, "InternalServerException"
        )
        assert "asked to fail" in message
        assert_error(
            client.post("/predictions/digest", content=b"deny"), 418, "InternalServerException"
        )
        message = assert_error(
            client.post("/predictions/digest", content=b"wrong-length"),
            500,
            "InternalServerException",
        )
        assert "results for a batch of 1" in message


def _fifo_pair(folder: Path) -> None:
    os.mkfifo(folder / "started")
    os.mkfifo(folder / "release")


async def _read_started(folder: Path) -> None:
    def read() -> bytes:
        with open(folder / "started", "rb") as fifo:
            return fifo.read()

    assert await asyncio.wait_for(asyncio.to_thread(read), 60) == b"1"


def _release(folder: Path) -> None:
    with open(folder / "release", "wb") as fifo:
        fifo.write(b"go")


def test_full_queue_answers_503_at_once(strict_server: RunningServer, tmp_path: Path) -> None:
    """One request holds the only worker; the queue (3) fills; the rest get 503 at once."""
    _fifo_pair(tmp_path)

    async def scenario() -> tuple[httpx.Response, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=strict_server.url, timeout=60) as client:
            blocker = asyncio.create_task(
                client.post("/predictions/gated", content=f"block:{tmp_path}".encode())
            )
            await _read_started(tmp_path)  # the worker now holds the blocking request
            queued = [
                asyncio.create_task(client.post("/predictions/gated", content=f"q{i}".encode()))
                for i in range(8)
            ]
            await asyncio.wait(queued, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            rejected = [t for t in queued if t.done()]
            # Rejections arrive while the worker is still blocked: they did not wait for it.
            assert rejected and all(t.result().status_code == 503 for t in rejected)
            await asyncio.to_thread(_release, tmp_path)
            results = await asyncio.gather(*queued)
            return await blocker, list(results)

    blocker, results = asyncio.run(scenario())
    assert blocker.status_code == 200
    statuses = sorted(r.status_code for r in results)
    assert statuses == [200] * 3 + [503] * 5
    for response in results:
        if response.status_code == 503:
            assert_error(response, 503, "ServiceUnavailableException")


@pytest.mark.parametrize("path", ["/ping"])
def test_ping_healthy_when_all_workers_ready(main_server: RunningServer, path: str) -> None:
    with main_server.client() as client:
        response = client.get(path)
        assert response.status_code == 200 and response.json() == {"status": "Healthy"}


@pytest.mark.parametrize("path", ["/predictions/digest", "/explanations/digest"])
def test_malformed_multipart_body_is_400(main_server: RunningServer, path: str) -> None:
    """The same message on the predictions' fast path and through the routes."""
    with main_server.client() as client:
        response = client.post(
            path,
            content=b"--xyz\r\nContent-Disposition: form-data\r\n\r\nunterminated",
            headers={"content-type": "multipart/form-data; boundary=xyz"},
        )
        message = assert_error(response, 400, "BadRequestException")
        assert message.startswith("malformed form body: ") and "400" not in message


def test_response_over_max_response_size_is_500(strict_server: RunningServer) -> None:
    with strict_server.client() as client:
        assert client.post("/predictions/slow", content=b"big:4000").status_code == 200
        response = client.post("/predictions/slow", content=b"big:6000")
        message = assert_error(response, 500, "ResponseTooLargeException")
        assert "max_response_size 5000" in message
