"""TorchServe's conventions on a real server: x-request-id, CORS, PredictionException's body,
TS_CONFIG_FILE, a model's jobQueueSize, describe's fields, an archive linked into the
store, a misspelt model name's 404."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.gate import busy_worker
from tests.fixtures.models import digest_archive, echo_store, ts_style_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server

ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Configured through ``TS_CONFIG_FILE`` only: CORS on; ``tiny`` queues one request;
    ``linked`` is a symbolic link into the store."""
    tmp = tmp_path_factory.mktemp("conventions")
    store, elsewhere = tmp / "store", tmp / "elsewhere"
    store.mkdir()
    elsewhere.mkdir()
    digest_archive(store, "echo")
    digest_archive(store, "tiny", jobQueueSize=1)
    ts_style_archive(store)
    (store / "linked.mar").symlink_to(elsewhere / digest_archive(elsewhere, "linked"))
    config = tmp / "config.properties"
    config.write_text(
        f"cors_allowed_origin={ORIGIN}\n"
        "cors_allowed_methods=GET, POST, PUT, OPTIONS\n"
        "cors_allowed_headers=X-Custom-Header\n"
    )
    models = ["echo=echo.mar", "tiny=tiny.mar", "doubler=doubler.mar", "linked.mar"]
    with contextlib.ExitStack() as stack:
        patch = pytest.MonkeyPatch()
        patch.setenv("TS_CONFIG_FILE", str(config))
        try:
            running = stack.enter_context(ferry_server(store, models, tmp))
        finally:
            patch.undo()  # for this server's process only
        yield running


def test_x_request_id_is_echoed_and_reaches_the_handler(server: RunningServer) -> None:
    with server.client() as client:
        given = client.post(
            "/predictions/doubler", content=b"[1]", headers={"x-request-id": "trace-7"}
        )
        assert given.status_code == 200, given.text
        assert given.headers["x-request-id"] == "trace-7"
        assert given.headers["x-first-request"] == "trace-7"  # context.get_request_id(0)
        generated = client.post("/predictions/echo", content=b"x")
        assert generated.headers["x-request-id"]
        other = client.post("/predictions/echo", content=b"x")
        assert other.headers["x-request-id"] != generated.headers["x-request-id"]
        assert "server" not in other.headers  # uvicorn's name is not sent
        assert "date" in other.headers


def test_a_prediction_exception_keeps_torchserves_body(server: RunningServer) -> None:
    with server.client() as client:
        message = assert_error(
            client.post("/predictions/echo", content=b"deny"), 418, "InternalServerException"
        )
        assert message == "denied by the handler"


def test_cors_preflight_and_simple_requests_on_every_api(server: RunningServer) -> None:
    preflight_headers = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "X-Custom-Header",
    }
    for base in (server.url, server.management_url):
        preflight = httpx.options(f"{base}/", headers=preflight_headers, timeout=60)
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in preflight.headers["access-control-allow-methods"]
        described = httpx.options(f"{base}/", timeout=60)  # no preflight: the OpenAPI document
        assert described.status_code == 200 and "openapi" in described.json()
    with server.client() as client:
        simple = client.post("/predictions/echo", content=b"x", headers={"Origin": ORIGIN})
        assert simple.headers["access-control-allow-origin"] == ORIGIN


def test_cors_headers_are_absent_when_not_configured(tmp_path: Path) -> None:
    with (
        ferry_server(echo_store(tmp_path), ["echo.mar"], tmp_path) as plain,
        plain.client() as client,
    ):
        answer = client.post("/predictions/echo", content=b"x", headers={"Origin": ORIGIN})
        assert answer.status_code == 200
        assert "access-control-allow-origin" not in answer.headers
        assert answer.headers["x-request-id"]
        preflight = client.options(
            "/", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        )
        assert "access-control-allow-origin" not in preflight.headers


def test_describe_has_torchserves_fields(server: RunningServer) -> None:
    with server.management() as api:
        (tiny,) = api.get("/models/tiny").json()
    for field in (
        "deviceType",
        "deviceIds",
        "parallelType",
        "parallelLevel",
        "maxRetryTimeoutInSec",
        "clientTimeoutInMills",
        "continuousBatching",
        "useJobTicket",
        "useVenv",
        "stateful",
        "sequenceMaxIdleMSec",
        "sequenceTimeoutMSec",
        "maxNumSequence",
        "maxSequenceJobQueueSize",
        "startupTimeout",
    ):
        assert field in tiny, field
    assert tiny["jobQueueSize"] == 1 and tiny["jobQueueStatus"]["remainingCapacity"] == 1


def test_a_linked_startup_model_loads(server: RunningServer) -> None:
    with server.client() as client:
        assert client.get("/ping").json() == {"status": "Healthy"}
        assert client.post("/predictions/linked", content=b"x").status_code == 200


def test_a_misspelt_model_name_is_answered_with_the_close_one(server: RunningServer) -> None:
    """Issue 51: the 404 names the registered models that look like the name asked for
    (echo, tiny, doubler, linked here), the same on every HTTP protocol; never the rest."""
    meant = "Model not found: tinyy (did you mean 'tiny'?)"
    with server.client() as client:
        assert assert_error(client.post("/predictions/tinyy"), 404, "ModelNotFoundException") == (
            meant
        )
        v1 = client.post("/v1/models/tinyy:predict", json={"instances": [1]})
        v2 = client.get("/v2/models/tinyy")
        assert (v1.status_code, v1.json()) == (404, {"error": meant})
        assert (v2.status_code, v2.json()) == (404, {"error": meant})
        far = client.post("/predictions/resnet")
        assert assert_error(far, 404, "ModelNotFoundException") == "Model not found: resnet"


def test_job_queue_size_from_model_config_limits_the_queue(
    server: RunningServer, tmp_path: Path
) -> None:
    answers: list[int] = []

    def post(body: bytes) -> None:
        response = httpx.post(f"{server.url}/predictions/tiny", content=body, timeout=120)
        answers.append(response.status_code)

    def pending() -> int:
        with server.management() as api:
            (tiny,) = api.get("/models/tiny").json()
        return int(tiny["jobQueueStatus"]["pendingRequests"])

    with busy_worker(server, "tiny", tmp_path / "gate") as held:
        queued = threading.Thread(target=post, args=(b"queued",))
        queued.start()
        wait_until("one request queued", lambda: pending() == 1, process=server.process)
        with server.client() as client:
            assert_error(
                client.post("/predictions/tiny", content=b"x"), 503, "ServiceUnavailableException"
            )
    queued.join(timeout=120)
    assert held == [200] and answers == [200]
