"""A ``ModelRunner`` loaded on demand, under ``Residency``, over fake workers: no worker
until a request, the request answered once the load is done, eviction leaving it ready to
load again, a failed load answering what waited with the reason, and a request queued
while the model is evicted loading it again (none lost)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ferry.capacity.budgets import HOST
from ferry.errors import NoWorkerAvailable
from ferry.metrics.definitions import FerryMetrics
from ferry.scheduling.model_runner import ModelRunner, RunnerSettings
from ferry.scheduling.pool import Backoff
from ferry.scheduling.residency import LoadState, Residency
from ferry.worker_handles.handle import WorkerInfo
from tests.fixtures.fake_worker import FakeFactory, load_error, make_job, outcomes, spec

BOUND = 30.0


def on_demand_runner(factory: FakeFactory, name: str = "m", workers: int = 1) -> ModelRunner:
    settings = RunnerSettings(
        batch_size=1,
        max_batch_delay=0.0,
        workers=workers,
        response_timeout=5.0,
        startup_timeout=5.0,
        queue_capacity=100,
        torch_threads=1,
        load_on_demand=True,
    )
    return ModelRunner(
        name,
        "1.0",
        spec(name),
        settings,
        factory,
        FerryMetrics().for_model(name, "1.0"),
        backoff=lambda: Backoff(first=0.0, cap=0.0),
    )


def managed(residency: Residency, runner: ModelRunner) -> ModelRunner:
    residency.add(runner, on_demand=True, estimate={HOST: 0})
    runner.demand = residency.wanted
    runner.load_refused = residency.refusal
    runner.start()
    return runner


async def until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), BOUND)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), BOUND))


def test_it_has_no_worker_until_a_request_which_is_answered_once_loaded() -> None:
    async def scenario() -> None:
        factory = FakeFactory()
        runner = managed(Residency({}), on_demand_runner(factory))
        assert runner.slots == [] and runner.is_ready() and factory.attempts == 0
        runner.check_admission()  # no worker yet, and still admitted
        jobs = [make_job(b"a"), make_job(b"b")]
        for job in jobs:
            runner.submit(job)
        answers = await outcomes(jobs)
        assert [a.body for a in answers] == [b"a", b"b"]  # type: ignore[union-attr]
        assert factory.attempts == 1 and runner.resident()
        await runner.stop()

    run(scenario)


def test_an_evicted_model_loads_again_on_its_next_request() -> None:
    async def scenario() -> None:
        factory = FakeFactory()
        residency = Residency({})
        runner = managed(residency, on_demand_runner(factory))
        first = make_job(b"1")
        runner.submit(first)
        await outcomes([first])
        await runner.evict()
        assert not runner.resident() and factory.started[0].killed
        second = make_job(b"2")
        runner.submit(second)
        (answer,) = await outcomes([second])
        assert answer.body == b"2"  # type: ignore[union-attr]
        assert factory.attempts == 2
        await runner.stop()

    run(scenario)


def test_a_load_that_fails_answers_what_waited_with_the_reason() -> None:
    async def scenario() -> None:
        factory = FakeFactory(load_error("ImportError: no module named nothing"))
        residency = Residency({})
        runner = managed(residency, on_demand_runner(factory))
        job = make_job()
        runner.submit(job)
        (answer,) = await outcomes([job])
        assert isinstance(answer, NoWorkerAvailable)
        assert "no module named nothing" in answer.message
        await until(lambda: residency.state("m v1.0") == LoadState.IDLE)
        assert not runner.resident()  # nothing half-loaded: the next request tries again
        await runner.stop()

    run(scenario)


def test_a_model_registered_without_workers_loads_one_on_demand() -> None:
    """Issue 47: ``POST /models?url=x.mar`` gives 0 initial workers (TorchServe's
    default); its load on demand started none and its requests waited forever."""

    async def scenario() -> None:
        factory = FakeFactory()
        runner = managed(Residency({}), on_demand_runner(factory, workers=0))
        job = make_job(b"a")
        runner.submit(job)
        (answer,) = await outcomes([job])
        assert answer.body == b"a"  # type: ignore[union-attr]
        assert factory.attempts == 1 and len(runner.slots) == 1
        await runner.stop()

    run(scenario)


def test_after_a_failed_load_requests_are_refused_at_once_with_its_error() -> None:
    async def scenario() -> None:
        factory = FakeFactory(load_error("ImportError: no module named nothing"))
        clock = Clock()
        residency = Residency({}, clock=clock)
        runner = managed(residency, on_demand_runner(factory))
        job = make_job()
        runner.submit(job)
        await outcomes([job])
        await until(lambda: residency.state("m v1.0") == LoadState.IDLE)
        attempts = factory.attempts
        for _ in range(5):
            try:
                runner.submit(make_job())
            except NoWorkerAvailable as refused:
                assert "no module named nothing" in refused.message
                assert "the next is tried in" in refused.message
            else:
                raise AssertionError("admitted during the backoff")
        assert factory.attempts == attempts  # no load started
        clock.now += 2.0
        retried = make_job()
        runner.submit(retried)  # due: a load is tried again (and fails again)
        (answer,) = await outcomes([retried])
        assert isinstance(answer, NoWorkerAvailable)
        assert factory.attempts > attempts
        await runner.stop()

    run(scenario)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_request_queued_while_its_model_is_evicted_is_answered() -> None:
    async def scenario() -> None:
        factory = FakeFactory()
        # A budget of 1 byte: every model is over it, so each load evicts the other.
        residency = Residency({HOST: 1})
        a = managed(residency, on_demand_runner(factory, "a"))
        b = managed(residency, on_demand_runner(factory, "b"))
        original_footprint = a.footprint
        a.footprint = lambda: {HOST: 1} if a.resident() else {}  # type: ignore[method-assign]
        b.footprint = lambda: {HOST: 1} if b.resident() else {}  # type: ignore[method-assign]
        first = make_job(b"a1")
        a.submit(first)
        await outcomes([first])
        evict_a = a.evict
        queued: list[Any] = []

        async def evict_with_a_request_arriving() -> None:
            eviction = asyncio.ensure_future(evict_a())
            await asyncio.sleep(0)  # the eviction has retired a's worker: a has none now
            assert not a.slots
            job = make_job(b"a2")
            a.submit(job)  # admitted: a loads on demand
            queued.append(job)
            await eviction

        a.evict = evict_with_a_request_arriving  # type: ignore[method-assign]
        other = make_job(b"b1")
        b.submit(other)
        answers = await outcomes([other])
        await until(lambda: bool(queued))
        (late,) = await outcomes(queued, timeout=10)
        assert answers[0].body == b"b1"  # type: ignore[union-attr]
        assert late.body == b"a2"  # type: ignore[union-attr]
        a.footprint = original_footprint  # type: ignore[method-assign]
        await a.stop()
        await b.stop()

    run(scenario)


def test_a_request_waiting_alone_or_an_open_sequence_keeps_the_model_busy() -> None:
    """Retries after a crash and describe calls wait in the dispatcher's own queue: a
    model holding one is in use, not to be evicted."""

    async def scenario() -> None:
        runner = on_demand_runner(FakeFactory())
        runner.start()
        assert not runner.busy()
        job = make_job()
        runner.submit_alone(job)  # no worker yet, no residency: it waits
        assert runner.waiting == 0 and runner.busy()
        await runner.stop()
        assert isinstance(job.future.exception(), NoWorkerAvailable)

    run(scenario)


def test_weights_its_workers_map_from_one_file_count_once_in_its_footprint() -> None:
    async def scenario() -> None:
        factory = FakeFactory()
        runner = managed(Residency({}), on_demand_runner(factory, workers=3))
        job = make_job(b"a")
        runner.submit(job)
        await outcomes([job])
        await until(lambda: len(factory.started) == 3)
        maps = [("/w/weights.pt", 400), ("/w/weights.pt", 400), ("/w/other.pt", 50)]
        for worker, (key, size) in zip(factory.started, maps, strict=True):
            worker.measured = WorkerInfo(
                worker.pid, "cpu", 10, shared_weights_bytes=size, shared_weights_key=key
            )
        assert runner.footprint() == {HOST: 3 * 10 + 400 + 50}
        await runner.stop()

    run(scenario)


def test_a_weights_keepers_copy_counts_once_on_its_gpu() -> None:
    async def scenario() -> None:
        factory = FakeFactory()
        runner = managed(Residency({}), on_demand_runner(factory, workers=3))
        job = make_job(b"a")
        runner.submit(job)
        await outcomes([job])
        await until(lambda: len(factory.started) == 3)
        for worker in factory.started:  # each imported the keeper's 400 bytes on its GPU
            key = "keeper:cuda:/w/weights.pt"
            worker.measured = WorkerInfo(
                worker.pid, "cuda:0", 10, 5, shared_weights_bytes=400, shared_weights_key=key
            )
        assert runner.footprint() == {HOST: 3 * 10, "cuda:0": 3 * 5 + 400}
        for worker in factory.started:  # the CPU stand-in's copy is in host memory
            key = "keeper:cpu:/w/weights.pt"
            worker.measured = WorkerInfo(
                worker.pid, "cpu", 10, shared_weights_bytes=400, shared_weights_key=key
            )
        assert runner.footprint() == {HOST: 3 * 10 + 400}
        await runner.stop()

    run(scenario)
