"""The transport-neutral service over fake workers: health, readiness, predictions,
registration and scaling speak the service's own types and domain errors."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest

from ferry.apis import pinned_cores
from ferry.capacity.sizing import Machine
from ferry.config.settings import ServerSettings
from ferry.errors import ModelLoadFailed, ModelNotFound, NoWorkerAvailable
from ferry.scheduling.pool import MAX_DETERMINISTIC_FAILURES
from ferry.service import FerryService, startup
from ferry.service.types import (
    Health,
    InputPart,
    ModelRef,
    Prediction,
    PredictionRequest,
    RegisterRequest,
)
from ferry.store.archive import open_model
from ferry.wire.environment import USER_AFFINITY
from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.core_allocation import CoreAllocator
from tests.fixtures.fake_worker import Behaviour, FakeWorker, load_error
from tests.fixtures.models import digest_archive

BOUND = 30.0


class ByModel:
    """Starts an echoing fake worker, or fails to load models whose name is in ``broken``
    (and workers whose handler is ``invalidHandler``)."""

    def __init__(self, *broken: str) -> None:
        self.broken = set(broken)
        self.started: list[WorkerSpec] = []

    async def __call__(self, spec: WorkerSpec, startup_timeout: float) -> FakeWorker:
        self.started.append(spec)
        if spec.model.model_name in self.broken or spec.model.handler == "invalidHandler":
            raise load_error(f"RuntimeError: {spec.model.model_name} cannot load")
        return FakeWorker(Behaviour.ECHO)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), BOUND))


async def settle(service: FerryService, name: str) -> None:
    """Until every slot of ``name`` either serves or gave up."""
    runner = service._runner(name)
    while not all(slot.state.serving or slot.gave_up for slot in runner.slots):
        await asyncio.sleep(0)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "good")
    digest_archive(store, "bad")
    return store


def service_for(store: Path, *broken: str, **settings: object) -> FerryService:
    values: dict[str, object] = {"model_store": store, "enable_model_api": True, **settings}
    return _service(ServerSettings(**values), ByModel(*broken))  # type: ignore[arg-type]


def _pinned(service: FerryService) -> CoreAllocator | None:
    return cast(CoreAllocator | None, service.models.machine.pinned)


def _service(settings: ServerSettings, workers: ByModel) -> FerryService:
    """As ``ferry.apis`` assembles it (the cores it pins with ``cpu_pinning`` included),
    with fake workers."""
    pinned = pinned_cores(settings.cpu_pinning, None)
    machine = Machine(None, 0, pinned)
    return FerryService(settings, workers, machine)


def test_health_is_torchserves_rule_over_start_up_models(store: Path) -> None:
    async def scenario() -> None:
        service = service_for(store, "bad", models=("good=good.mar", "bad=bad.mar"))
        await service.load_startup_models()
        await settle(service, "bad")
        assert service.health() == Health("Partial Healthy") and service.health().ok
        assert service.readiness("good").ready
        bad = service.readiness("bad")
        assert not bad.ready and "bad cannot load" in bad.reason
        (status,) = service.describe("bad", None)
        assert not status.ready and "bad cannot load" in status.last_error
        assert status.workers[0].status == "FAILED"
        assert status.workers[0].restarts == MAX_DETERMINISTIC_FAILURES
        await service.close()

    run(scenario)


def test_health_is_unhealthy_when_no_start_up_worker_runs(store: Path) -> None:
    async def scenario() -> None:
        service = service_for(store, "good", models=("good=good.mar",))
        await service.load_startup_models()
        await settle(service, "good")
        assert service.health() == Health("Unhealthy") and not service.health().ok
        await service.close()

    run(scenario)


def test_health_is_unhealthy_while_start_up_archives_open(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listeners serve before start-up models are registered: /ping must not say
    Healthy then (it did, and ``ferry bench`` sent requests that got 404)."""

    async def scenario() -> None:
        service = service_for(store, models=("good=good.mar",))
        opening, release = threading.Event(), threading.Event()
        open_model_now = startup.open_startup_model

        def slow_open(*args: Any) -> Any:
            opening.set()
            release.wait(BOUND)
            return open_model_now(*args)

        monkeypatch.setattr("ferry.service.archives.open_startup_model", slow_open)
        loading = asyncio.create_task(service.load_startup_models())
        await asyncio.to_thread(opening.wait, BOUND)
        assert service.health() == Health("Unhealthy")
        release.set()
        await loading
        assert service.health() == Health("Healthy")
        await service.close()

    run(scenario)


def test_a_misspelt_model_name_is_answered_with_the_close_one(store: Path) -> None:
    """Every transport answers with this message: REST's 404 body, gRPC's NOT_FOUND."""

    async def scenario() -> None:
        service = service_for(store, models=("good=good.mar",))
        await service.load_startup_models()
        with pytest.raises(
            ModelNotFound, match=r"^Model not found: godo \(did you mean 'good'\?\)$"
        ):
            service.resolve("godo")
        with pytest.raises(ModelNotFound, match=r"^Model not found: elsewhere$"):
            service.admit("elsewhere")
        await service.close()

    run(scenario)


def test_predict_speaks_the_services_own_types(store: Path) -> None:
    async def scenario() -> None:
        service = service_for(store, models=("good=good.mar",))
        await service.load_startup_models()
        assert service.resolve("good") == ModelRef("good", "1.0")
        with pytest.raises(ModelNotFound):
            service.resolve("missing")
        request = PredictionRequest([InputPart("body", "text/plain", b"hi")], {})
        answer = await service.predict(service.admit("good"), request)
        assert isinstance(answer, Prediction) and answer.body == b"hi"
        await service.close()

    run(scenario)


def test_a_model_that_gave_up_answers_503_with_its_load_error(store: Path) -> None:
    async def scenario() -> None:
        service = service_for(store, "bad", models=("bad=bad.mar",))
        await service.load_startup_models()
        await settle(service, "bad")
        with pytest.raises(NoWorkerAvailable, match="last load error: RuntimeError: bad cannot"):
            service.admit("bad")
        await service.close()

    run(scenario)


def test_registration_and_synchronous_scale_failure(store: Path) -> None:
    async def scenario() -> None:
        service = service_for(store)
        request = RegisterRequest(
            url="good.mar",
            model_name="invalid",
            handler="invalidHandler",
            initial_workers=0,
            synchronous=True,
        )
        registered = await service.register(request)
        assert registered.model == ModelRef("invalid", "1.0") and registered.workers == 0
        with pytest.raises(ModelLoadFailed, match="invalid cannot load"):
            await service.scale("invalid", None, 1, 1, synchronous=True)
        assert service.describe("invalid", None)[0].min_workers == 0
        scaled = await service.scale("invalid", None, 0, 0, synchronous=True)
        assert scaled.workers == 0
        await service.close()

    run(scenario)


def test_registration_whose_workers_cannot_load_is_rolled_back(store: Path) -> None:
    async def scenario() -> None:
        service = service_for(store, "bad")
        request = RegisterRequest(url="bad.mar", initial_workers=1, synchronous=True)
        with pytest.raises(ModelLoadFailed, match="bad cannot load"):
            await service.register(request)
        with pytest.raises(ModelNotFound):
            service.resolve("bad")
        await service.close()

    run(scenario)


def test_archives_are_opened_off_the_event_loop(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unpacking a large archive must not stall inference: it runs in a thread."""
    threads: list[threading.Thread] = []
    real_open = open_model

    def recording_open(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        return real_open(*args, **kwargs)

    monkeypatch.setattr("ferry.service.archives.open_model", recording_open)  # registration
    monkeypatch.setattr("ferry.service.startup.open_model", recording_open)  # start-up models

    async def scenario() -> None:
        service = service_for(store, models=("good=good.mar",))
        await service.load_startup_models()
        await service.register(RegisterRequest(url="bad.mar", initial_workers=0))
        assert len(threads) == 2
        assert all(thread is not threading.main_thread() for thread in threads)
        await service.close()

    run(scenario)


def test_pinned_workers_split_the_cores_those_of_later_models_what_is_left(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``cpu_pinning`` each worker needs cores of its own: the start-up models' workers
    share the cores, a model registered later the cores they leave free (before, every
    model's worker asked for all of them, and only the first was pinned)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    for name in USER_AFFINITY:
        monkeypatch.delenv(name, raising=False)
    digest_archive(store, "late")

    def threads(service: FerryService, name: str) -> int:
        return service._runner(name).settings.torch_threads

    async def scenario() -> None:
        service = service_for(store, models=("good=good.mar", "bad=bad.mar"), cpu_pinning=True)
        await service.load_startup_models()
        assert (threads(service, "good"), threads(service, "bad")) == (4, 4)
        cores = _pinned(service)
        assert cores is not None
        cores.claim(6)  # as if their workers, were they real processes, held 6 of them
        await service.register(RegisterRequest(url="late.mar", initial_workers=2, synchronous=True))
        assert threads(service, "late") == 1
        await service.unregister("late", None)
        cores.claim(2)
        # No core free: the usual split, and the workers run unpinned (they log it).
        await service.register(RegisterRequest(url="late.mar", initial_workers=2, synchronous=True))
        assert threads(service, "late") == 4
        await service.close()

    run(scenario)


@pytest.mark.parametrize("pinning", [False, True])
def test_scaling_up_gives_new_workers_the_model_s_share_for_its_new_count(
    store: Path, monkeypatch: pytest.MonkeyPatch, pinning: bool
) -> None:
    """TorchServe's flow: register with no workers (or one), then scale. Each worker
    scaled up got the thread count of the workers at registration, every core for none or
    one: unpinned, 4 workers ran 8 threads each on 8 cores; pinned, the first took every
    core and the others ran unpinned."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    for name in USER_AFFINITY:
        monkeypatch.delenv(name, raising=False)
    workers = ByModel()

    def new_threads(count: int) -> list[int]:
        return [spec.torch_threads for spec in workers.started[-count:]]

    async def scenario() -> None:
        settings = {"model_store": store, "enable_model_api": True, "cpu_pinning": pinning}
        service = _service(ServerSettings(**settings), workers)  # type: ignore[arg-type]
        cores = _pinned(service)
        await service.register(RegisterRequest(url="good.mar", initial_workers=0))
        await service.scale("good", None, 2, 2, synchronous=True)
        assert new_threads(2) == [4, 4]
        if cores is not None:
            cores.claim(6)  # as if those workers, and another model's, held 6 cores
        await service.scale("good", None, 4, 4, synchronous=True)  # in steps
        assert new_threads(2) == ([1, 1] if pinning else [2, 2])  # pinned: the 2 left
        if cores is not None:
            cores.release(range(8))
        await service.scale("good", None, 0, 0, synchronous=True)
        await service.scale("good", None, 1, 1, synchronous=True)  # from none again
        assert new_threads(1) == [8]
        await service.close()

    run(scenario)


def test_a_scale_up_that_fails_leaves_the_model_s_thread_count_as_it_was(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))

    async def scenario() -> None:
        service = service_for(store, "bad")
        await service.register(RegisterRequest(url="bad.mar", initial_workers=0))
        with pytest.raises(ModelLoadFailed, match="bad cannot load"):
            await service.scale("bad", None, 2, 2, synchronous=True)
        assert service._runner("bad").settings.torch_threads == 8
        await service.close()

    run(scenario)


@pytest.mark.parametrize("users_binding", [None, "OMP_PROC_BIND", "GOMP_CPU_AFFINITY"])
def test_unpinned_each_models_workers_split_every_core(
    store: Path, monkeypatch: pytest.MonkeyPatch, users_binding: str | None
) -> None:
    """Without ``cpu_pinning``, or with it while the user binds threads themselves (then
    Ferry pins nothing, and must not shrink the workers' share either)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    for name in USER_AFFINITY:
        monkeypatch.delenv(name, raising=False)
    if users_binding is not None:
        monkeypatch.setenv(users_binding, "close")

    async def scenario() -> None:
        pinning = {"cpu_pinning": True} if users_binding else {}
        service = service_for(store, models=("good=good.mar", "bad=bad.mar"), **pinning)
        assert _pinned(service) is None
        await service.load_startup_models()
        assert [service._runner(name).settings.torch_threads for name in ("good", "bad")] == [8, 8]
        await service.close()

    run(scenario)
