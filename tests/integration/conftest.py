"""Real servers on free ports, shared by the integration tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.models import DEMO_STORE, broken_archive, digest_archive, ts_style_archive
from tests.fixtures.server import RunningServer, ferry_server


@pytest.fixture(scope="session")
def main_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """digest (batch 8, delay 50 ms), victim (kill tests), doubler (TorchServe-style), shapes."""
    tmp = tmp_path_factory.mktemp("main")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"digest={digest_archive(store, 'digest', batchSize=8, maxBatchDelay=50)}",
        f"victim={digest_archive(store, 'victim', batchSize=4, maxBatchDelay=5)}",
        f"doubler={ts_style_archive(store)}",
        "pipelined="
        + ts_style_archive(
            store,
            name="pipelined",
            batchSize=8,
            micro_batching={"micro_batch_size": 2, "parallelism": {"preprocess": 2}},
        ),
        "in_processes="
        + ts_style_archive(
            store,
            name="in_processes",
            batchSize=8,
            micro_batching={
                "micro_batch_size": 2,
                "parallelism": {"preprocess": 2},
                "pool": "process",
            },
        ),
    ]
    shutil.copy(DEMO_STORE / "shapes.mar", store / "shapes.mar")
    models.append("shapes=shapes.mar")
    with ferry_server(store, models, tmp) as server:
        yield server


@pytest.fixture(scope="session")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A small queue (3), a tight body limit, a model that cannot load, one that may hang."""
    tmp = tmp_path_factory.mktemp("strict")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"gated={digest_archive(store, 'gated', batchSize=1, maxBatchDelay=0)}",
        f"slow={digest_archive(store, 'slow', batchSize=1, responseTimeout=2)}",
        f"broken={broken_archive(store)}",
    ]
    extra = ["--job-queue-size", "3", "--max-request-size", "100000", "--max-response-size", "5000"]
    with ferry_server(store, models, tmp, *extra) as server:
        yield server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent.name == "integration":
            item.add_marker(pytest.mark.integration)
