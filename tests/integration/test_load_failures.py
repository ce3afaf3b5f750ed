"""Models that cannot load: the reason reaches describe, readiness and every 503; retries
stop; a synchronous scale-up that cannot start answers 500; /ping keeps TorchServe's rule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ferry.scheduling.pool import MAX_DETERMINISTIC_FAILURES
from tests.fixtures.models import broken_archive, digest_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server

LOAD_ERROR = "RuntimeError: this model cannot load"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """``good`` and ``broken`` loaded at start-up; the model API on for run-time models."""
    tmp = tmp_path_factory.mktemp("load-failures")
    store = tmp / "store"
    store.mkdir()
    models = [f"good={digest_archive(store, 'good')}", f"broken={broken_archive(store)}"]
    with ferry_server(store, models, tmp, "--enable-model-api") as running:
        yield running


def describe(api: httpx.Client, name: str) -> dict[str, Any]:
    response = api.get(f"/models/{name}")
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()[0]
    return document


def lines_of(server: RunningServer) -> list[str]:
    return server.log().splitlines()


def wait_given_up(server: RunningServer, api: httpx.Client, name: str) -> dict[str, Any]:
    wait_until(
        f"{name}'s worker to give up",
        lambda: describe(api, name)["workers"][-1]["status"] == "FAILED",
        process=server.process,
        log=server.log_path,
    )
    return describe(api, name)


def test_a_model_that_cannot_load_gives_up_and_says_why(server: RunningServer) -> None:
    with server.management() as api, server.client() as client:
        model = wait_given_up(server, api, "broken")
        (worker,) = model["workers"]
        assert worker["restarts"] == MAX_DETERMINISTIC_FAILURES
        assert LOAD_ERROR in worker["lastError"]
        assert model["ready"] is False and LOAD_ERROR in model["loadError"]
        message = assert_error(
            client.post("/predictions/broken", content=b"x"), 503, "ServiceUnavailableException"
        )
        assert f"last load error: {LOAD_ERROR}" in message
        readiness = client.get("/ping/broken")
        assert readiness.status_code == 503
        assert readiness.json()["status"] == "NotReady" and LOAD_ERROR in readiness.json()["reason"]
    # One log record per failed load, and no more once given up.
    lines = [line for line in lines_of(server) if "[broken " in line]
    assert sum("handler failed to load" in line for line in lines) == MAX_DETERMINISTIC_FAILURES
    assert sum("broken v" in line and "giving up" in line for line in lines_of(server)) == 1


def test_ping_follows_torchserves_rule_for_start_up_models(server: RunningServer) -> None:
    with server.management() as api, server.client() as client:
        wait_given_up(server, api, "broken")
        ping = client.get("/ping")
        assert ping.status_code == 200 and ping.json() == {"status": "Partial Healthy"}
        good = client.get("/ping/good")
        assert good.status_code == 200 and good.json()["status"] == "Ready"
        assert client.get("/ping/nothing").status_code == 404


def test_synchronous_scale_up_of_an_invalid_handler_is_500_and_undone(
    server: RunningServer,
) -> None:
    with server.management() as api:
        registered = api.post(
            "/models",
            params={
                "url": "good.mar",
                "model_name": "invalid",
                "handler": "invalidHandler",
                "initial_workers": 0,
                "synchronous": "true",
            },
        )
        assert registered.status_code == 200, registered.text
        scaled = api.put("/models/invalid", params={"min_worker": 1, "synchronous": "true"})
        message = assert_error(scaled, 500, "InternalServerException")
        assert "invalidHandler" in message
        assert describe(api, "invalid")["minWorkers"] == 0
        assert api.delete("/models/invalid").status_code == 200


def test_a_run_time_model_that_cannot_load_leaves_ping_alone(server: RunningServer) -> None:
    with server.management() as api, server.client() as client:
        before = client.get("/ping").json()
        registered = api.post(
            "/models",
            params={
                "url": "good.mar",
                "model_name": "invalid_async",
                "handler": "invalidHandler",
                "initial_workers": 0,
                "synchronous": "true",
            },
        )
        assert registered.status_code == 200, registered.text
        assert api.put("/models/invalid_async", params={"min_worker": 1}).status_code == 202
        wait_given_up(server, api, "invalid_async")
        assert client.get("/ping").json() == before
        assert client.get("/ping/invalid_async").status_code == 503
        assert api.delete("/models/invalid_async").status_code == 200
