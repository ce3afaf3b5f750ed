"""``cpu_pinning``: a real server binds its worker's torch threads to cores of their own,
and without it (the default) leaves them free."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ferry.store.writer import ArchiveSpec, write_archive
from ferry.worker.cpu_pinning import USER_AFFINITY
from tests.fixtures.models import HANDLERS
from tests.fixtures.server import ferry_server


@pytest.fixture(autouse=True)
def user_pins_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable of the user's own would make the server leave the threads alone."""
    for name in USER_AFFINITY:
        monkeypatch.delenv(name, raising=False)


def where_threads_run(tmp: Path, *extra: str) -> dict[str, Any]:
    store = tmp / "store"
    store.mkdir(exist_ok=True)
    spec = ArchiveSpec(model_name="affinity", handler=str(HANDLERS / "affinity_handler.py"))
    archive = write_archive(spec, store, force=True).name
    with (
        ferry_server(store, [f"affinity={archive}"], tmp, *extra) as server,
        server.client() as client,
    ):
        response = client.post("/predictions/affinity", content=b"where")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_pinned_worker_threads_each_hold_a_core_of_their_own(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    answer = where_threads_run(tmp_path, "--cpu-pinning", "true")
    assert answer["handler_thread"] == cores[:1]
    bound = [affinity for affinity in answer["threads"].values() if len(affinity) == 1]
    # A torch thread on each core (the one worker has them all); threads started after
    # the binding share the handler's core.
    assert {core for (core,) in bound} == set(cores)
    # Dropped once torch read them: a process the worker starts does not bind its own
    # OpenMP threads to these cores again.
    assert answer["env"] == {"OMP_PLACES": None, "OMP_PROC_BIND": None}


def test_without_pinning_worker_threads_may_run_anywhere(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    answer = where_threads_run(tmp_path)
    assert answer["handler_thread"] == cores
    assert all(affinity == cores for affinity in answer["threads"].values())
