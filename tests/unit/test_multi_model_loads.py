"""SageMaker's multi-model loads over the service (``ferry.service.multi_model``), with fake
workers that report what their load took: refused with 507 before or after the load
when the model cannot fit, idle models evicted to make room, nothing left registered by
a load that failed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ferry import procinfo
from ferry.capacity.sizing import Machine
from ferry.config.settings import ServerSettings
from ferry.errors import InsufficientMemory, ModelAlreadyExists, ModelLoadFailed
from ferry.service import FerryService, multi_model
from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.handle import StartFailure, WorkerInfo, WorkerStartFailed
from tests.fixtures.fake_worker import Behaviour, FakeWorker, exited_while_loading, load_error
from tests.fixtures.models import digest_archive
from tests.fixtures.sagemaker_models import weights_model

MB = 1 << 20


class Measured:
    """Echoing fake workers whose load took ``sizes[model]`` bytes; ``broken`` ones fail."""

    def __init__(self, sizes: dict[str, int], broken: tuple[str, ...] = ()) -> None:
        self.sizes = sizes
        self.broken = broken

    async def __call__(self, spec: WorkerSpec, startup_timeout: float) -> FakeWorker:
        if spec.model.model_name in self.broken:
            raise load_error(f"RuntimeError: {spec.model.model_name} cannot load")
        worker = FakeWorker(Behaviour.ECHO)
        worker.measured = WorkerInfo(worker.pid, "cpu", self.sizes.get(spec.model.model_name, 0))
        return worker


class OomKilled:
    """Fake workers that die while loading, each killed by the OOM killer: ``kills`` is
    the container's count, as ``procinfo.oom_kills`` reads it (None: unreadable)."""

    def __init__(self, kills: int | None = 3) -> None:
        self.kills = kills

    async def __call__(self, spec: WorkerSpec, startup_timeout: float) -> FakeWorker:
        if self.kills is not None:
            self.kills += 1
        raise exited_while_loading()

    def count(self) -> int | None:
        return self.kills


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


@pytest.fixture
def store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    for name in ("a", "b", "c"):
        digest_archive(store, name)
    return store


def _service(store: Path, workers: Measured | OomKilled, budget_mb: int) -> FerryService:
    settings = ServerSettings(
        model_store=store,
        enable_model_api=True,
        load_models_on_demand=True,
        model_memory_budget_mb=budget_mb,
    )
    return FerryService(settings, workers, Machine(None, 0))


def test_a_load_registers_the_model_and_brings_its_worker_up(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store, Measured({"a": 2 * MB}), budget_mb=10)
        loaded = await multi_model.load(service, "a", "a.mar")
        assert (loaded.model.name, loaded.workers, loaded.ready) == ("a", 1, True)
        assert service._runner("a").resident()
        with pytest.raises(ModelAlreadyExists):
            await multi_model.load(service, "a", "b.mar")
        await service.close()

    run(scenario)


def test_idle_models_are_evicted_to_make_room_and_stay_registered(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store, Measured({"a": 6 * MB, "b": 6 * MB}), budget_mb=10)
        await multi_model.load(service, "a", "a.mar")
        await multi_model.load(service, "b", "b.mar")
        assert not service._runner("a").resident() and service._runner("b").resident()
        assert service.model_names() == ["a", "b"]  # SageMaker still counts both
        await service.close()

    run(scenario)


def test_a_model_that_took_more_than_fits_is_refused_after_its_load(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = tmp_path / "pinned-store"
        store.mkdir()
        digest_archive(store, "a", loadOnDemand=False)  # pinned: never evicted
        digest_archive(store, "b")
        service = _service(store, Measured({"a": 6 * MB, "b": 6 * MB}), budget_mb=10)
        await multi_model.load(service, "a", "a.mar")
        assert service._runner("a").ready_workers == 1
        with pytest.raises(InsufficientMemory, match="what it took once loaded"):
            await multi_model.load(service, "b", "b.mar")
        assert service.model_names() == ["a"]
        await service.close()

    run(scenario)


def test_a_model_whose_weights_cannot_fit_is_refused_before_any_worker_starts(
    store: Path,
) -> None:
    async def scenario() -> None:
        weights_model(store / "large", megabytes=2)
        service = _service(store, Measured({}, broken=("large",)), budget_mb=1)
        with pytest.raises(InsufficientMemory, match="judged by its weights"):
            await multi_model.load(service, "large", "large")
        assert service.model_names() == []  # and no worker started: it would have failed
        await service.close()

    run(scenario)


def test_a_load_that_fails_leaves_nothing_registered(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store, Measured({}, broken=("a",)), budget_mb=0)
        with pytest.raises(ModelLoadFailed, match="a cannot load"):
            await multi_model.load(service, "a", "a.mar", oom_kills=lambda: 0)
        assert service.model_names() == []
        await service.close()

    run(scenario)


def test_a_worker_the_oom_killer_killed_while_loading_is_a_507(store: Path) -> None:
    """SageMaker unloads a model and retries on 507; a 500 would fail the invocation."""

    async def scenario() -> None:
        workers = OomKilled()
        service = _service(store, workers, budget_mb=0)
        with pytest.raises(InsufficientMemory, match="OOM killer") as refused:
            await multi_model.load(service, "a", "a.mar", oom_kills=workers.count)
        assert "exited while loading" in str(refused.value)
        assert service.model_names() == []
        await service.close()

    run(scenario)


def test_without_an_oom_kill_or_a_count_a_worker_that_died_is_a_failed_load(store: Path) -> None:
    async def scenario() -> None:
        unreadable: Callable[[], int | None] = lambda: None  # noqa: E731
        unchanged: Callable[[], int | None] = lambda: 5  # noqa: E731 (no kill meanwhile)
        for workers, count in ((OomKilled(None), unreadable), (OomKilled(5), unchanged)):
            service = _service(store, workers, budget_mb=0)
            with pytest.raises(ModelLoadFailed, match="exited while loading"):
                await multi_model.load(service, "a", "a.mar", oom_kills=count)
            await service.close()

    run(scenario)


def test_the_oom_kill_count_is_read_from_the_containers_cgroup(tmp_path: Path) -> None:
    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n")
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    missing = tmp_path / "absent"
    assert procinfo.oom_kills((missing, v2, v1)) == 2
    assert procinfo.oom_kills((missing, v1)) == 7
    assert procinfo.oom_kills((missing,)) is None


class OutOfMemory:
    """Fake workers whose handler runs out of memory while loading."""

    async def __call__(self, spec: WorkerSpec, startup_timeout: float) -> FakeWorker:
        raise WorkerStartFailed(StartFailure.OUT_OF_MEMORY, "MemoryError: 64 GiB")


def test_a_handler_that_runs_out_of_memory_while_loading_is_a_507(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store, OutOfMemory(), budget_mb=0)  # type: ignore[arg-type]
        with pytest.raises(InsufficientMemory, match="ran out of memory while loading"):
            await multi_model.load(service, "a", "a.mar", oom_kills=lambda: 0)
        assert service.model_names() == []
        await service.close()

    run(scenario)
