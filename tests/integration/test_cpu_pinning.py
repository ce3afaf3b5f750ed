"""``cpu_pinning``: a real server binds its worker's torch threads to cores of their own;
without it (the default) only keeps torch's helper threads off the handler thread's core."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ferry.store.writer import ArchiveSpec, write_archive
from ferry.wire.environment import USER_AFFINITY
from tests.fixtures.models import HANDLERS
from tests.fixtures.server import ferry_server


@pytest.fixture(autouse=True)
def user_pins_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable of the user's own would make the server leave the threads alone."""
    for name in USER_AFFINITY:
        monkeypatch.delenv(name, raising=False)


def where_threads_run(
    tmp: Path, *extra: str, models: int = 1, warm: bool = False
) -> list[dict[str, Any]]:
    """Each of ``models`` models' answer (the same affinity handler under other names;
    ``warm``: torch's team started while it loads)."""
    store = tmp / "store"
    store.mkdir(exist_ok=True)
    names = [f"affinity{index}" for index in range(models)]
    plain = HANDLERS / "affinity_handler.py"
    handler = HANDLERS / "warm_affinity_handler.py" if warm else plain
    extra_files: tuple[Path, ...] = (plain,) if warm else ()
    for name in names:
        spec = ArchiveSpec(model_name=name, handler=str(handler), extra_files=extra_files)
        write_archive(spec, store, force=True)
    entries = [f"{name}={name}.mar" for name in names]
    with ferry_server(store, entries, tmp, *extra) as server, server.client() as client:
        # The second answer: a worker finds torch's helpers in its first batch.
        responses = [
            [client.post(f"/predictions/{name}", content=b"where") for _ in range(2)][-1]
            for name in names
        ]
    assert all(response.status_code == 200 for response in responses), responses[0].text
    return [response.json() for response in responses]


def bound_cores(answer: dict[str, Any]) -> set[int]:
    """The cores of the worker's threads bound to one core each (its torch threads)."""
    return {affinity[0] for affinity in answer["threads"].values() if len(affinity) == 1}


def test_pinned_worker_threads_each_hold_a_core_of_their_own(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    (answer,) = where_threads_run(tmp_path, "--cpu-pinning", "true")
    assert answer["handler_thread"] == cores[:1]
    # A torch thread on each core (the one worker has them all); threads started after
    # the binding share the handler's core.
    assert bound_cores(answer) == set(cores)
    # Dropped once torch read them: a process the worker starts does not bind its own
    # OpenMP threads to these cores again.
    assert answer["env"] == {"OMP_PLACES": None, "OMP_PROC_BIND": None}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_models_workers_split_the_cores(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    first, second = where_threads_run(tmp_path, "--cpu-pinning", "true", models=2)
    half = len(cores) // 2
    assert {len(bound_cores(first)), len(bound_cores(second))} == {half}
    assert not bound_cores(first) & bound_cores(second)
    assert first["handler_thread"] != second["handler_thread"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
@pytest.mark.parametrize("warm", [False, True], ids=["team-from-a-batch", "team-from-the-load"])
def test_without_pinning_torch_helpers_leave_the_handler_threads_core(
    tmp_path: Path, warm: bool
) -> None:
    cores = sorted(os.sched_getaffinity(0))
    (answer,) = where_threads_run(tmp_path, warm=warm)
    assert answer["handler_thread"] == cores
    # Before the batch the worker took the handler thread's core out of torch's helper
    # threads' cores (ferry.worker.helper_threads); every other thread keeps them all.
    narrowed = [tuple(affinity) for affinity in answer["threads"].values() if affinity != cores]
    assert answer["torch_threads"] >= 2
    assert len(narrowed) == answer["torch_threads"] - 1  # the helpers, and only they
    (helper_cores,) = set(narrowed)
    assert len(helper_cores) == len(cores) - 1
    assert set(helper_cores) < set(cores)


def test_with_the_users_own_binding_no_thread_is_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_PROC_BIND", "false")  # binds nothing, and says: leave mine alone
    (answer,) = where_threads_run(tmp_path)
    assert answer["handler_thread"] == cores
    assert all(affinity == cores for affinity in answer["threads"].values())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_handler_may_fork_before_its_first_parallel_operation(tmp_path: Path) -> None:
    # Ferry runs no torch operation of its own in the worker: a team of OpenMP threads in
    # the parent when the handler forks would hang the child's first parallel operation.
    store = tmp_path / "store"
    store.mkdir()
    spec = ArchiveSpec(model_name="forks", handler=str(HANDLERS / "fork_handler.py"))
    write_archive(spec, store)
    with ferry_server(store, ["forks=forks.mar"], tmp_path) as server, server.client() as client:
        response = client.post("/predictions/forks", content=b"fork")
    assert response.status_code == 200, response.text
    assert response.text == "0"
