"""Models of one process group served by a real server: one process for both, each with
its own module state; a crash or a hang in one model restarts the process, and the
neighbour answers again afterwards; models without a group keep processes of their own."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.models import digest_archive
from tests.fixtures.server import RunningServer, ferry_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("shared")
    store = tmp / "store"
    store.mkdir()
    models = [
        digest_archive(store, "left", processGroup="pair", responseTimeout=3),
        digest_archive(store, "right", processGroup="pair", responseTimeout=3),
        digest_archive(store, "alone"),
    ]
    with ferry_server(store, models, tmp) as running:
        yield running


def worker_pid(server: RunningServer, model: str) -> int:
    with server.management() as api:
        (described,) = api.get(f"/models/{model}").json()
    (worker,) = described["workers"]
    return int(worker["pid"])


def predict(client: httpx.Client, model: str, body: bytes) -> httpx.Response:
    return client.post(f"/predictions/{model}", content=body)


def test_a_group_shares_one_process_and_each_model_keeps_its_own_state(
    server: RunningServer,
) -> None:
    with server.client() as client:
        left = predict(client, "left", b"a").json()
        right = predict(client, "right", b"a").json()
        alone = predict(client, "alone", b"a").json()
    assert left["pid"] == right["pid"] != alone["pid"]
    # The handler module's batch counter is each model's own: its files were imported
    # once per model, not shared through sys.modules.
    assert left["sequence"] == right["sequence"]
    with server.management() as api:
        (described,) = api.get("/models/left").json()
        (alone_described,) = api.get("/models/alone").json()
    assert described["processGroup"] == "pair"
    assert described["workers"][0]["sharedProcess"] is True
    assert described["workers"][0]["modelMemory"] >= 0
    assert "processGroup" not in alone_described
    assert alone_described["workers"][0]["sharedProcess"] is False


def test_a_crash_in_one_model_restarts_the_process_and_the_neighbour_answers(
    server: RunningServer,
) -> None:
    before = worker_pid(server, "right")
    with server.client() as client:
        crashed = predict(client, "left", b"crash")
        assert crashed.status_code == 500, crashed.text
        assert "died" in crashed.json()["message"]
        after = predict(client, "right", b"b")
        assert after.status_code == 200, after.text
        assert after.json()["pid"] != before
        assert predict(client, "left", b"b").json()["pid"] == after.json()["pid"]
        assert predict(client, "alone", b"b").status_code == 200


def test_a_hung_model_is_answered_504_and_its_neighbour_serves_on(
    server: RunningServer,
) -> None:
    before = worker_pid(server, "left")
    with server.client() as client:
        hung = predict(client, "right", b"hang")
        assert hung.status_code == 504, hung.text
        after = predict(client, "left", b"c")
        assert after.status_code == 200, after.text
        assert after.json()["pid"] != before
    assert "killing host pid" in server.log()
