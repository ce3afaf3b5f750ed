"""Models loaded on demand and evicted under a memory budget, on a real server: nothing
resident until the first request, concurrent first requests load once, the least recently
used idle model goes when another needs the room, a busy or pinned one stays, and a
snapshot brings an on-demand model back registered but not resident.

The ballast handler holds 24 MB from its load on, so a budget of 60 MB holds the pinned
model and one on-demand model, not two."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.gate import busy_worker
from tests.fixtures.models import HANDLERS, handler_archive, write_config
from tests.fixtures.polling import wait_until
from tests.fixtures.server import RunningServer, ferry_server

BALLAST = "ballast_handler.py"
MB = 1 << 20


def store_of(tmp: Path) -> tuple[Path, list[str]]:
    store = tmp / "store"
    store.mkdir()
    models = [handler_archive(store, name, BALLAST, loadOnDemand=True) for name in "abc"]
    models.append(handler_archive(store, "pinned", BALLAST, loadOnDemand=False))
    return store, models


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    store, models = store_of(tmp_path)
    with ferry_server(store, models, tmp_path, "--model-memory-budget-mb", "60") as running:
        yield running


def describe(server: RunningServer, model: str) -> dict[str, Any]:
    with server.management() as api:
        (described,) = api.get(f"/models/{model}").json()
    return described  # type: ignore[no-any-return]


def resident(server: RunningServer, model: str) -> bool:
    return describe(server, model)["resident"] is True


def metric(server: RunningServer, name: str, model: str | None = None) -> float:
    labels = f'{{model_name="{model}",model_version="1.0"}}' if model else ""
    match = re.search(rf"^{name}{re.escape(labels)} (\S+)$", server.metrics(), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def predict(server: RunningServer, model: str, body: bytes = b"x") -> httpx.Response:
    return httpx.post(f"{server.url}/predictions/{model}", content=body, timeout=120)


def test_nothing_loads_until_asked_and_concurrent_first_requests_load_once(
    server: RunningServer,
) -> None:
    described = describe(server, "a")
    assert described["loadOnDemand"] is True and described["resident"] is False
    assert described["workers"] == [] and described["ready"] is True
    assert httpx.get(f"{server.url}/ping/a", timeout=30).status_code == 200
    assert describe(server, "pinned")["workers"] != []  # pinned: loaded at start-up
    assert "loadOnDemand" not in describe(server, "pinned")

    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(lambda _: predict(server, "a"), range(5)))
    assert [answer.status_code for answer in answers] == [200] * 5
    assert len({answer.json()["pid"] for answer in answers}) == 1
    assert metric(server, "ferry_model_loads_total", "a") == 1
    described = describe(server, "a")
    assert described["resident"] is True and described["processGroup"] == "shared"
    (worker,) = described["workers"]
    assert worker["modelMemory"] >= 20 * MB  # the ballast, measured at the load
    assert metric(server, "ferry_model_resident", "a") == 1


def test_the_least_recently_used_idle_model_is_evicted_and_comes_back(
    server: RunningServer,
) -> None:
    assert predict(server, "a").status_code == 200
    assert predict(server, "b").status_code == 200
    wait_until("a to be evicted", lambda: not resident(server, "a"), process=server.process)
    assert resident(server, "b") and describe(server, "pinned")["workers"] != []
    assert metric(server, "ferry_model_evictions_total", "a") == 1

    again = predict(server, "a")
    assert again.status_code == 200 and again.json()["batches"] == 1  # a fresh copy
    wait_until("b to be evicted", lambda: not resident(server, "b"), process=server.process)
    assert metric(server, "ferry_model_loads_total", "a") == 2
    assert metric(server, "ferry_model_evictions_total", "pinned") == 0
    assert "evicted (least recently used)" in server.log()


def test_a_busy_model_stays_and_the_load_goes_over_budget(tmp_path: Path) -> None:
    """``a`` in a process group of its own: its blocked request holds that process's
    handler thread, not the one ``b`` loads on."""
    store = tmp_path / "store"
    store.mkdir()
    models = [
        handler_archive(store, "a", BALLAST, loadOnDemand=True, processGroup="apart"),
        handler_archive(store, "b", BALLAST, loadOnDemand=True),
        handler_archive(store, "pinned", BALLAST, loadOnDemand=False),
    ]
    with ferry_server(store, models, tmp_path, "--model-memory-budget-mb", "60") as server:
        assert predict(server, "a").status_code == 200
        with busy_worker(server, "a", tmp_path / "gate") as statuses:
            assert predict(server, "b").status_code == 200
            assert resident(server, "a") and resident(server, "b")
        assert statuses == [200]
        assert metric(server, "ferry_memory_budget_exceeded_total") >= 1
        assert "past the memory budget" in server.log()


def test_a_snapshot_brings_an_on_demand_model_back_registered_not_resident(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    handler_archive(store, "plain", BALLAST)  # no loadOnDemand of its own
    logs = tmp_path / "logs"
    flags = ("--enable-model-api", "--log-location", str(logs))
    with ferry_server(store, [], tmp_path, *flags, "--load-models-on-demand", "true") as server:
        with server.management() as api:
            registered = api.post("/models", params={"url": "plain.mar", "synchronous": "true"})
            assert registered.status_code == 200, registered.text
        assert predict(server, "plain").status_code == 200
        assert resident(server, "plain")
    with ferry_server(store, [], tmp_path, *flags) as server:  # the flag is not given again
        described = describe(server, "plain")
        assert described["loadOnDemand"] is True and described["resident"] is False
        assert predict(server, "plain").status_code == 200
        assert resident(server, "plain")


def _on_demand_archive(store: Path, name: str, handler: str) -> str:
    """``loadOnDemand: true`` and nothing else: no ``minWorkers`` (issue 47's archive)."""
    scratch = store.parent / f"{name}-src"
    scratch.mkdir(exist_ok=True)
    config = write_config(scratch, {"loadOnDemand": True})
    spec = ArchiveSpec(model_name=name, handler=str(HANDLERS / handler), config_file=config)
    return write_archive(spec, store, force=True).name


def test_a_model_registered_without_workers_loads_one_and_answers_everything(
    tmp_path: Path,
) -> None:
    """``POST /models?url=lazy.mar`` registers 0 workers (TorchServe's default); its load
    on demand started none, and of 150 concurrent requests 97 waited forever."""
    store = tmp_path / "store"
    store.mkdir()
    archive = _on_demand_archive(store, "lazy", BALLAST)
    with ferry_server(store, [], tmp_path, "--enable-model-api") as server:
        with server.management() as api:
            registered = api.post("/models", params={"url": archive})
            assert registered.status_code == 200, registered.text
        described = describe(server, "lazy")
        assert described["minWorkers"] == 0 and described["loadOnDemand"] is True
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda _: predict(server, "lazy"), range(90)))
        assert [answer.status_code for answer in answers] == [200] * 90
        assert len(describe(server, "lazy")["workers"]) == 1


def test_a_load_that_keeps_failing_is_not_retried_by_every_request(tmp_path: Path) -> None:
    """Each request to an on-demand model whose load crashes started a new load (13
    worker processes in 20 s). After a failed load, requests are refused at once with
    its error until the next load is due."""
    store = tmp_path / "store"
    store.mkdir()
    archive = _on_demand_archive(store, "crashing", "broken_handler.py")
    with ferry_server(store, [f"crashing={archive}"], tmp_path) as server:
        first = predict(server, "crashing")
        assert first.status_code == 503, first.text
        assert "this model cannot load" in first.json()["message"]
        loads = server.log().count("this model cannot load")
        refused = [predict(server, "crashing") for _ in range(10)]
        assert {answer.status_code for answer in refused} == {503}
        for answer in refused:
            message = answer.json()["message"]
            assert "this model cannot load" in message and "the next is tried in" in message
        assert server.log().count("this model cannot load") == loads  # no load started
        assert "load on demand failed 1 times in a row" in server.log()
