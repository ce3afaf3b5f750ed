"""Edge semantics of TorchServe's management API, found by running its own postman
collection against Ferry: customized describe, trailing slashes, ``startup_timeout=0``,
synchronous registration by default."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import HANDLERS, digest_archive
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("ts-edges")
    store = tmp / "store"
    store.mkdir()
    spec = ArchiveSpec(model_name="described", handler=str(HANDLERS / "describing_handler.py"))
    write_archive(spec, store, force=True)
    digest_archive(store, "plain")
    with ferry_server(store, [], tmp, "--enable-model-api") as running:
        yield running


def test_customized_describe_adds_the_handlers_metadata(server: RunningServer) -> None:
    with server.management() as api:
        registered = api.post("/models", params={"url": "described.mar", "initial_workers": 1})
        assert registered.status_code == 200, registered.text
        try:
            plain = api.get("/models/described").json()
            customized = api.get("/models/described", params={"customized": "true"}).json()
            assert "customizedMetadata" not in plain[0]
            assert customized[0]["customizedMetadata"] == {"data1": "1", "data2": "2"}
            assert customized[0]["modelName"] == "described"
            with server.client() as client:  # ordinary requests are unaffected
                answer = client.post("/predictions/described", content=b"abc")
            assert answer.json() == {"echo": 3}
        finally:
            api.delete("/models/described")


def test_customized_describe_without_a_worker_is_503(server: RunningServer) -> None:
    with server.management() as api:
        registered = api.post("/models", params={"url": "described.mar", "initial_workers": 0})
        assert registered.status_code == 200, registered.text
        try:
            response = api.get("/models/described", params={"customized": "true"})
            message = assert_error(response, 503, "ServiceUnavailableException")
            assert message.startswith('Model "described" has no worker to serve describe')
        finally:
            api.delete("/models/described")


def test_a_trailing_slash_is_served_not_redirected(server: RunningServer) -> None:
    with server.management() as api:
        assert api.post("/models", params={"url": "plain.mar"}).status_code == 200
        listed = api.get("/models/")
        assert listed.status_code == 200 and listed.json()["models"][0]["modelName"] == "plain"
        deleted = api.delete("/models/plain/", params={"synchronous": "true"})
        assert deleted.status_code == 200, deleted.headers
        assert api.get("/models/plain").status_code == 404


def test_registration_is_synchronous_unless_told_otherwise(server: RunningServer) -> None:
    """TorchServe's code defaults ``synchronous`` to true for registration."""
    with server.management() as api:
        response = api.post("/models", params={"url": "plain.mar", "initial_workers": 1})
        try:
            assert response.status_code == 200, response.text
            assert "registered with 1 initial workers" in response.json()["status"]
            assert api.get("/models/plain").json()[0]["workers"][0]["status"] == "READY"
        finally:
            api.delete("/models/plain")


def test_startup_timeout_zero_is_accepted(server: RunningServer) -> None:
    """As in TorchServe: fine without workers; workers cannot start within it (500)."""
    with server.management() as api:
        params: dict[str, str | int] = {
            "url": "plain.mar",
            "startup_timeout": 0,
            "initial_workers": 0,
        }
        idle = api.post("/models", params=params)
        assert idle.status_code == 200, idle.text
        assert api.get("/models/plain").json()[0]["startupTimeout"] == 0
        assert api.delete("/models/plain").status_code == 200
        params["initial_workers"] = 1
        assert_error(api.post("/models", params=params), 500, "InternalServerException")
        assert api.get("/models/plain").status_code == 404  # rolled back
