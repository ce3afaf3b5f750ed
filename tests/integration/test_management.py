"""TorchServe's management API through real HTTP: every endpoint, status and error path."""

from __future__ import annotations

import asyncio
import functools
import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ferry_bench.load import LoadResult, run_closed_loop
from tests.fixtures.models import broken_archive, digest_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Model API enabled; the store holds more archives than are loaded at start.

    alpha, beta and gamma, loaded at start, are only read: a test that registers, scales or
    unregisters works on models of its own and removes them (``unregister_afterwards``).
    """
    tmp = tmp_path_factory.mktemp("managed")
    store = tmp / "store"
    store.mkdir()
    digest_archive(store, "alpha", batchSize=4, maxBatchDelay=5)
    digest_archive(store, "beta")
    digest_archive(store, "gamma")
    digest_archive(store, "late", minWorkers=0)
    for name in ("versioned", "switching"):
        digest_archive(store, name, batchSize=4, maxBatchDelay=5)
        digest_archive(store, name, version="2.0", file_stem=f"{name}_v2")
    broken_archive(store)
    models = ["alpha=alpha.mar", "beta=beta.mar", "gamma=gamma.mar"]
    with ferry_server(store, models, tmp, "--enable-model-api") as server:
        yield server


@pytest.fixture
def unregister_afterwards(managed: RunningServer) -> Iterator[Callable[[str], None]]:
    """Every version of each model name given to it is unregistered when the test ends,
    whether it passed or not, so no test sees what another one registered."""
    names: list[str] = []

    yield names.append
    with managed.management() as api:
        for name in names:
            _unregister_every_version(api, name)


def _unregister_every_version(api: httpx.Client, name: str) -> None:
    listed = api.get(f"/models/{name}/all")
    if listed.status_code == 404:
        return
    default = api.get(f"/models/{name}").json()[0]["modelVersion"]
    others = [m["modelVersion"] for m in listed.json() if m["modelVersion"] != default]
    for version in [*others, default]:  # the default version goes last
        api.delete(f"/models/{name}/{version}")


def _register(api: httpx.Client, url: str) -> None:
    response = api.post("/models", params={"url": url, "initial_workers": 1, "synchronous": "true"})
    assert response.status_code == 200, response.text


def test_list_models_and_pagination_edges(managed: RunningServer) -> None:
    with managed.management() as api:
        everything = api.get("/models").json()
        names = [m["modelName"] for m in everything["models"]]
        assert names[:3] == ["alpha", "beta", "gamma"] and "nextPageToken" not in everything
        assert everything["models"][0]["modelUrl"] == "alpha.mar"
        first = api.get("/models", params={"limit": 1}).json()
        assert [m["modelName"] for m in first["models"]] == ["alpha"]
        second = api.get("/models", params={"limit": 1, "next_page_token": first["nextPageToken"]})
        assert [m["modelName"] for m in second.json()["models"]] == ["beta"]
        assert api.get("/models", params={"limit": 0}).json() == {"models": []}
        assert len(api.get("/models", params={"limit": -5}).json()["models"]) == len(names)
        past = api.get("/models", params={"next_page_token": 999}).json()
        assert past == {"models": []}
        assert_error(api.get("/models", params={"limit": "lots"}), 400, "BadRequestException")


def test_describe_has_torchserve_fields(managed: RunningServer) -> None:
    with managed.management() as api:
        (model,) = api.get("/models/alpha").json()
        assert model["modelName"] == "alpha" and model["modelVersion"] == "1.0"
        assert model["modelUrl"] == "alpha.mar" and model["runtime"] == "python"
        assert model["batchSize"] == 4 and model["maxBatchDelay"] == 5
        assert model["minWorkers"] == 1 and model["maxWorkers"] >= 1
        assert model["responseTimeout"] == 120 and model["loadedAtStartup"] is True
        assert model["jobQueueStatus"] == {"remainingCapacity": 100, "pendingRequests": 0}
        (worker,) = model["workers"]
        assert worker["status"] == "READY" and worker["pid"] > 0 and worker["gpu"] is False
        assert worker["memoryUsage"] > 0 and worker["startTime"].endswith("Z")
        assert api.get("/models/alpha/1.0").json()[0]["modelVersion"] == "1.0"
        assert [m["modelVersion"] for m in api.get("/models/alpha/all").json()] == ["1.0"]
        assert_error(api.get("/models/nope"), 404, "ModelNotFoundException")
        assert_error(api.get("/models/alpha/9.9"), 404, "ModelNotFoundException")


def test_register_versions_set_default_and_unregister(
    managed: RunningServer, unregister_afterwards: Callable[[str], None]
) -> None:
    unregister_afterwards("versioned")
    with managed.management() as api, managed.client() as inference:
        _register(api, "versioned.mar")  # version 1.0, the default
        response = api.post(
            "/models",
            params={"url": "versioned_v2.mar", "initial_workers": 1, "synchronous": "true"},
        )
        assert response.status_code == 200
        assert response.json() == {
            "status": 'Model "versioned" Version: 2.0 registered with 1 initial workers'
        }
        conflict = api.post("/models", params={"url": "versioned_v2.mar"})
        assert_error(conflict, 409, "ConflictStatusException")
        versions = [m["modelVersion"] for m in api.get("/models/versioned/all").json()]
        assert sorted(versions) == ["1.0", "2.0"]
        assert inference.post("/predictions/versioned/2.0", content=b"x").status_code == 200
        message = assert_error(api.delete("/models/versioned/1.0"), 400, "BadRequestException")
        assert "default" in message
        response = api.put("/models/versioned/2.0/set-default")
        assert response.json()["status"] == (
            'Default version successfully updated for model "versioned" to "2.0"'
        )
        assert api.get("/models/versioned").json()[0]["modelVersion"] == "2.0"
        assert_error(api.put("/models/versioned/7.0/set-default"), 404, "ModelNotFoundException")
        assert api.delete("/models/versioned/1.0").json() == {
            "status": 'Model "versioned" unregistered'
        }
        assert_error(
            inference.post("/predictions/versioned/1.0", content=b"x"),
            404,
            "ModelNotFoundException",
        )
        assert inference.post("/predictions/versioned", content=b"x").status_code == 200


def test_register_with_json_body_and_zero_workers(
    managed: RunningServer, unregister_afterwards: Callable[[str], None]
) -> None:
    unregister_afterwards("late")
    with managed.management() as api, managed.client() as inference:
        response = api.post(
            "/models", json={"url": "late.mar", "batch_size": 2, "synchronous": True}
        )
        assert response.status_code == 200
        assert (
            "registered with 0 initial workers. Use scale workers API" in response.json()["status"]
        )
        (model,) = api.get("/models/late").json()
        assert (
            model["batchSize"] == 2 and model["workers"] == [] and model["loadedAtStartup"] is False
        )
        assert_error(
            inference.post("/predictions/late", content=b"x"), 503, "ServiceUnavailableException"
        )
        scaled = api.put("/models/late", params={"min_worker": 1, "synchronous": "true"})
        assert scaled.json() == {"status": "Workers scaled to 1 for model: late"}
        assert inference.post("/predictions/late", content=b"x").status_code == 200
        assert api.delete("/models/late").status_code == 200


def test_asynchronous_registration_answers_202_then_loads(
    managed: RunningServer, unregister_afterwards: Callable[[str], None]
) -> None:
    unregister_afterwards("later")
    with managed.management() as api, managed.client() as inference:
        params: dict[str, str | int] = {
            "url": "late.mar",
            "model_name": "later",
            "initial_workers": 1,
        }
        response = api.post("/models", params={**params, "synchronous": "false"})
        assert response.status_code == 202
        assert response.json() == {"status": "Processing worker updates..."}
        # Requests queue while the worker loads, then are answered.
        assert inference.post("/predictions/later", content=b"x").status_code == 200
        assert api.get("/models/later").json()[0]["workers"][0]["status"] == "READY"
        assert api.delete("/models/later").status_code == 200


def test_invalid_registrations_are_400_and_leave_nothing_behind(managed: RunningServer) -> None:
    with managed.management() as api:
        assert "url is required" in assert_error(api.post("/models"), 400, "BadRequestException")
        assert_error(
            api.post("/models", params={"url": "beta.mar", "batch_size": 0}),
            400,
            "BadRequestException",
        )
        assert_error(
            api.post("/models", params={"url": "beta.mar", "synchronous": "maybe"}),
            400,
            "BadRequestException",
        )
        assert_error(
            api.post("/models", content=b"[1]", headers={"content-type": "application/json"}),
            400,
            "BadRequestException",
        )
        assert_error(
            api.post("/models", params={"url": "absent.mar"}), 404, "ModelNotFoundException"
        )
        empty = api.post("/models", params={"url": ""})
        assert assert_error(empty, 404, "ModelNotFoundException") == "empty url"
        assert_error(
            api.post("/models", params={"url": "../escape.mar"}), 400, "InvalidModelException"
        )
        assert_error(
            api.post("/models", params={"url": "beta.mar", "runtime": "java"}),
            400,
            "BadRequestException",
        )
        failed = api.post(
            "/models", params={"url": "broken.mar", "initial_workers": 1, "synchronous": "true"}
        )
        assert "failed to load" in assert_error(failed, 500, "InternalServerException")
        assert_error(api.get("/models/broken"), 404, "ModelNotFoundException")


def test_remote_urls_are_refused_unless_allowed(managed: RunningServer) -> None:
    with managed.management() as api:
        refused = api.post("/models", params={"url": "http://127.0.0.1:9/model.mar"})
        assert "does not match any allowed URL" in assert_error(refused, 400, "InvalidUrlException")


def test_scaling_validation_and_unknown_models(managed: RunningServer) -> None:
    with managed.management() as api:
        assert_error(
            api.put("/models/beta", params={"min_worker": 2, "max_worker": 1}),
            400,
            "BadRequestException",
        )
        assert_error(api.put("/models/beta", params={"min_worker": -1}), 400, "BadRequestException")
        assert_error(
            api.put("/models/nope", params={"min_worker": 1}), 404, "ModelNotFoundException"
        )
        assert_error(api.delete("/models/nope"), 404, "ModelNotFoundException")
        assert_error(api.patch("/models/beta"), 405, "MethodNotAllowedException")


def test_scaling_and_switching_versions_under_load_fail_no_request(
    managed: RunningServer, unregister_afterwards: Callable[[str], None]
) -> None:
    async def scenario() -> tuple[LoadResult, list[int]]:
        load = asyncio.create_task(
            run_closed_loop(
                f"{managed.url}/predictions/switching",
                [f"g{i}".encode() for i in range(50)],
                concurrency=8,
                requests=600,
            )
        )
        statuses = []
        async with httpx.AsyncClient(base_url=managed.management_url, timeout=120) as api:
            steps: list[tuple[str, str, dict[str, str | int]]] = [
                ("PUT", "/models/switching", {"min_worker": 2, "synchronous": "true"}),
                (
                    "POST",
                    "/models",
                    {"url": "switching_v2.mar", "initial_workers": 1, "synchronous": "true"},
                ),
                ("PUT", "/models/switching/2.0/set-default", {}),
                ("PUT", "/models/switching/1.0", {"min_worker": 1, "synchronous": "true"}),
                ("PUT", "/models/switching/1.0/set-default", {}),
                ("PUT", "/models/switching/2.0", {"min_worker": 0, "synchronous": "true"}),
            ]
            for method, path, params in steps:
                response = await api.request(method, path, params=params)
                statuses.append(response.status_code)
        return await load, statuses

    unregister_afterwards("switching")
    with managed.management() as api:
        _register(api, "switching.mar")  # version 1.0, one worker
    result, statuses = asyncio.run(scenario())
    assert statuses == [200] * 6
    assert result.statuses == {200: 600}
    with managed.management() as api:
        (model,) = api.get("/models/switching").json()
        assert model["modelVersion"] == "1.0" and len(model["workers"]) == 1


def test_model_api_disabled_by_default(main_server: RunningServer) -> None:
    with main_server.management() as api:
        assert_error(
            api.post("/models", params={"url": "digest.mar"}), 405, "MethodNotAllowedException"
        )
        assert_error(api.delete("/models/digest"), 405, "MethodNotAllowedException")
        assert api.get("/models/digest").status_code == 200  # describing stays available


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_allowed_remote_url_is_downloaded_and_registered(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    digest_archive(served, "remote")
    handler = functools.partial(_QuietHandler, directory=str(served))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as archive_server:
        threading.Thread(target=archive_server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{archive_server.server_address[1]}"
        store = tmp_path / "store"
        store.mkdir()
        allowed = ["--enable-model-api", "--allowed-urls", r"http://127\.0\.0\.1:\d+/.*\.mar"]
        try:
            with ferry_server(store, [], tmp_path, *allowed) as server, server.management() as api:
                response = api.post(
                    "/models",
                    params={
                        "url": f"{base}/remote.mar",
                        "initial_workers": 1,
                        "synchronous": "true",
                    },
                )
                assert response.status_code == 200, response.text
                assert (store / "remote.mar").exists()
                with server.client() as inference:
                    assert inference.post("/predictions/remote", content=b"x").status_code == 200
                assert_error(
                    api.post("/models", params={"url": f"{base}/missing.mar"}),
                    400,
                    "BadRequestException",
                )
                assert_error(
                    api.post("/models", params={"url": "https://example.com/a.mar"}),
                    400,
                    "InvalidUrlException",
                )
                # As TorchServe: unregistering deletes what was downloaded, so the same
                # URL registers again (TorchServe's postman collection does just that).
                assert api.delete("/models/remote").status_code == 200
                assert not (store / "remote.mar").exists()
                again = api.post("/models", params={"url": f"{base}/remote.mar"})
                assert again.status_code == 200, again.text
        finally:
            archive_server.shutdown()


def test_asynchronous_registration_of_an_unloadable_model_is_rolled_back(
    managed: RunningServer,
) -> None:
    failure = "broken v1.0 failed to load"
    logged_before = managed.log().count(failure)  # an earlier attempt may have logged it
    with managed.management() as api:
        params: dict[str, str | int] = {
            "url": "broken.mar",
            "initial_workers": 1,
            "synchronous": "false",
        }
        accepted = api.post("/models", params=params)
        assert accepted.status_code == 202
        # Waits for the worker's attempt; the failure is logged once the rollback is done.
        wait_until(
            "rollback of the unloadable model",
            lambda: api.get("/models/broken").status_code == 404,
        )
    wait_until("log line of the failure", lambda: managed.log().count(failure) > logged_before)
