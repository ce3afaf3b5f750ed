"""The scheduling core against fake workers: every failure of a worker, of its start, and
of Ferry's own delivery answers every request, and the slot carries on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ferry.errors import (
    ClientGone,
    DeadlineExceeded,
    HandlerFailed,
    ModelLoadFailed,
    NoWorkerAvailable,
    ResponseTimeout,
    WorkerDied,
)
from ferry.metrics.definitions import FerryMetrics
from ferry.scheduling.jobs import Prediction
from ferry.scheduling.model_runner import ModelRunner, RunnerSettings
from ferry.scheduling.observers import Observer
from ferry.scheduling.pool import MAX_DETERMINISTIC_FAILURES, Backoff, RecyclePolicy, SlotState
from ferry.worker_handles.handle import StartFailure, WorkerFactory, WorkerStartFailed
from tests.fixtures.fake_worker import (
    Behaviour,
    FakeFactory,
    exited_while_loading,
    load_error,
    make_job,
    outcomes,
    spec,
)

BOUND = 30.0
"""Seconds any step may take before the test fails instead of hanging."""


def settings(**overrides: Any) -> RunnerSettings:
    values: dict[str, Any] = {
        "batch_size": 4,
        "max_batch_delay": 0.0,
        "workers": 1,
        "response_timeout": 5.0,
        "startup_timeout": 5.0,
        "queue_capacity": 100,
        "torch_threads": 1,
    }
    return RunnerSettings(**{**values, **overrides})


def runner_with(
    factory: WorkerFactory, observer: Observer | None = None, **overrides: Any
) -> ModelRunner:
    """Model ``m`` v1.0 over ``factory``'s workers, watched by ``observer`` if given, its
    settings these tests' with ``overrides``."""
    return ModelRunner(
        "m",
        "1.0",
        spec(),
        settings(**overrides),
        factory,
        FerryMetrics().for_model("m", "1.0"),
        backoff=lambda: Backoff(first=0.0, cap=0.0),
        observer=observer,
    )


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), BOUND))


async def wait_until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop until ``condition`` holds (bounded by the test's BOUND)."""
    while not condition():
        await asyncio.sleep(0)


def bodies(results: list[Any]) -> list[bytes]:
    return [r.body for r in results if isinstance(r, Prediction)]


def test_echo_answers_every_request() -> None:
    async def scenario() -> None:
        runner = runner_with(FakeFactory(Behaviour.ECHO))
        runner.start()
        await runner.wait_started()
        jobs = [make_job(f"{i}".encode()) for i in range(10)]
        for job in jobs:
            runner.submit(job)
        assert bodies(await outcomes(jobs)) == [f"{i}".encode() for i in range(10)]
        await runner.stop()

    run(scenario)


@pytest.mark.parametrize("failure", [Behaviour.GARBLE, Behaviour.WRONG_BATCH, Behaviour.EXIT])
def test_a_broken_exchange_retries_on_a_fresh_worker(failure: Behaviour) -> None:
    """A garbled frame (e.g. a worker of another Ferry version) or a death mid-batch: the
    worker is killed, the slot restarts, and the requests are answered by the next one."""

    async def scenario() -> None:
        factory = FakeFactory(failure, Behaviour.ECHO)
        runner = runner_with(factory)
        runner.start()
        await runner.wait_started()
        jobs = [make_job(b"a"), make_job(b"b")]
        for job in jobs:
            runner.submit(job)
        assert bodies(await outcomes(jobs)) == [b"a", b"b"]
        assert factory.started[0].killed
        assert runner.slots[0].restarts == 1
        await wait_until(lambda: runner.slots[0].state is SlotState.READY)
        await runner.stop()

    run(scenario)


def test_a_lone_request_that_kills_its_worker_fails_without_killing_another() -> None:
    async def scenario() -> None:
        factory = FakeFactory(poison=b"poison")
        runner = runner_with(factory)
        runner.start()
        await runner.wait_started()
        job = make_job(b"poison")
        runner.submit(job)
        (result,) = await outcomes([job])
        assert isinstance(result, WorkerDied)
        assert runner.slots[0].restarts == 1  # the culprit was not retried on a new worker
        await runner.stop()

    run(scenario)


def test_a_hung_worker_is_killed_and_its_requests_time_out() -> None:
    async def scenario() -> None:
        factory = FakeFactory(Behaviour.HANG, Behaviour.ECHO)
        runner = runner_with(factory, response_timeout=0.01)
        runner.start()
        hung = make_job()
        runner.submit(hung)
        (result,) = await outcomes([hung])
        assert isinstance(result, ResponseTimeout)
        assert factory.started[0].killed
        later = make_job(b"next")
        runner.submit(later)
        assert bodies(await outcomes([later])) == [b"next"]
        await runner.stop()

    run(scenario)


def test_a_worker_that_stops_reading_is_bounded_by_the_response_timeout() -> None:
    """Sending counts against responseTimeout too. The batch never reached the stuck
    worker, so it is retried on the next one; when that one is stuck too, it times out."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.STOP_READING, Behaviour.ECHO)
        runner = runner_with(factory, response_timeout=0.01)
        runner.start()
        job = make_job(b"x")
        runner.submit(job)
        assert bodies(await outcomes([job])) == [b"x"]
        assert factory.started[0].killed
        await runner.stop()

        stuck = runner_with(FakeFactory(Behaviour.STOP_READING), response_timeout=0.01)
        stuck.start()
        job = make_job()
        stuck.submit(job)
        (result,) = await outcomes([job])
        assert isinstance(result, ResponseTimeout)
        await stuck.stop()

    run(scenario)


def test_an_error_in_delivery_answers_the_batch_and_the_slot_carries_on() -> None:
    class ExplodingMetrics:
        """Delivery records stage timings first; make that raise, as a bug would."""

        def __init__(self) -> None:
            self.calls = 0

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

        def stages(self, stage_ms: dict[str, float]) -> None:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("bug in delivery")

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.ECHO)
        runner = runner_with(factory)
        runner.dispatcher.metrics = ExplodingMetrics()  # type: ignore[assignment]
        runner.start()
        first = make_job(b"1")
        runner.submit(first)
        (result,) = await outcomes([first])
        assert isinstance(result, Prediction | WorkerDied | HandlerFailed)
        second = make_job(b"2")
        runner.submit(second)
        assert bodies(await outcomes([second])) == [b"2"]
        await runner.stop()

    run(scenario)


def test_a_factory_that_raises_anything_does_not_kill_the_slot() -> None:
    async def scenario() -> None:
        calls = 0
        inner = FakeFactory(Behaviour.ECHO)

        async def flaky(worker_spec: Any, timeout: float) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("unexpected")
            return await inner(worker_spec, timeout)

        runner = ModelRunner(
            "m", "1.0", spec(), settings(), flaky, backoff=lambda: Backoff(first=0.0, cap=0.0)
        )
        runner.start()
        await wait_until(lambda: runner.ready_workers == 1)
        job = make_job(b"ok")
        runner.submit(job)
        assert bodies(await outcomes([job])) == [b"ok"]
        await runner.stop()

    run(scenario)


def test_deterministic_load_failures_give_up_with_the_reason() -> None:
    async def scenario() -> None:
        factory = FakeFactory(load_error())
        runner = runner_with(factory)
        runner.start()
        queued = make_job()
        runner.submit(queued)
        await wait_until(lambda: runner.slots[0].gave_up)
        await asyncio.sleep(0)  # one more turn: a slot that gave up must not try again
        assert factory.attempts == MAX_DETERMINISTIC_FAILURES
        assert runner.slots[0].state is SlotState.FAILED
        (result,) = await outcomes([queued])
        assert isinstance(result, NoWorkerAvailable) and "No module named" in result.message
        with pytest.raises(NoWorkerAvailable, match="last load error: ModuleNotFoundError"):
            runner.submit(make_job())
        assert "No module named" in runner.last_error()
        assert not runner.is_ready()
        await runner.stop()

    run(scenario)


def test_a_worker_dying_while_loading_is_retried_beyond_the_give_up_limit() -> None:
    async def scenario() -> None:
        failures = [exited_while_loading()] * (MAX_DETERMINISTIC_FAILURES + 2)
        factory = FakeFactory(*failures, Behaviour.ECHO)
        runner = runner_with(factory)
        runner.start()
        await wait_until(lambda: runner.ready_workers == 1)
        assert factory.attempts == MAX_DETERMINISTIC_FAILURES + 3
        await runner.stop()

    run(scenario)


def test_synchronous_scale_up_fails_with_the_reason_and_is_undone() -> None:
    async def scenario() -> None:
        factory = FakeFactory(Behaviour.ECHO, load_error("SyntaxError: invalid syntax"))
        runner = runner_with(factory)
        runner.start()
        await runner.wait_started()
        with pytest.raises(ModelLoadFailed, match="SyntaxError"):
            await runner.scale(2, 2, wait=True)
        assert len(runner.slots) == 1 and runner.ready_workers == 1
        await runner.stop()

    run(scenario)


def test_a_synchronous_scale_waits_for_workers_an_earlier_scale_is_still_loading() -> None:
    """TorchServe's postman collection scales asynchronously, then synchronously to the same
    count: the second answer must mean the worker is up, not merely that it exists."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.ECHO)
        loading = asyncio.Event()

        async def slow_start(worker_spec: Any, timeout: float) -> Any:
            await loading.wait()
            return await factory(worker_spec, timeout)

        runner = runner_with(slow_start, workers=0)
        runner.start()
        await runner.scale(1, 1, wait=False)
        synchronous = asyncio.ensure_future(runner.scale(1, 1, wait=True))
        await wait_until(lambda: bool(runner.slots))
        for _ in range(10):  # it stays waiting while the worker loads
            await asyncio.sleep(0)
        assert not synchronous.done()
        loading.set()
        await synchronous
        assert runner.ready_workers == 1
        await runner.stop()

    run(scenario)


def test_a_worker_retired_while_loading_stops_loading_at_once() -> None:
    """Scaled down (or unregistered) before it loaded: its start is cancelled, so it never
    goes on loading files the model's removal deletes."""

    async def scenario() -> None:
        loading, cancelled = asyncio.Event(), asyncio.Event()

        async def never_loads(worker_spec: Any, timeout: float) -> Any:
            loading.set()
            try:
                await asyncio.get_running_loop().create_future()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        runner = runner_with(never_loads, workers=0)
        runner.start()
        await runner.scale(1, 1, wait=False)
        await loading.wait()
        await runner.scale(0, 0, wait=True)
        await cancelled.wait()
        assert runner.slots == []
        await runner.stop()

    run(scenario)


def test_scaling_again_revives_a_slot_that_gave_up() -> None:
    async def scenario() -> None:
        factory = FakeFactory(*[load_error()] * MAX_DETERMINISTIC_FAILURES, Behaviour.ECHO)
        runner = runner_with(factory)
        runner.start()
        await wait_until(lambda: runner.slots[0].gave_up)
        await runner.scale(1, 1, wait=True)
        assert runner.ready_workers == 1
        await runner.stop()

    run(scenario)


def test_recycling_after_n_requests_fails_no_request() -> None:
    async def scenario() -> None:
        factory = FakeFactory(Behaviour.ECHO)
        runner = runner_with(factory, recycle=RecyclePolicy(max_requests=3), batch_size=1)
        runner.start()
        jobs = [make_job(f"{i}".encode()) for i in range(10)]
        for job in jobs:
            runner.submit(job)
        assert bodies(await outcomes(jobs)) == [f"{i}".encode() for i in range(10)]
        assert len(factory.started) >= 3
        assert all(worker.killed for worker in factory.started[:-1])
        assert runner.slots[0].recycles >= 2 and runner.slots[0].restarts == 0
        # The limit, plus at most the one batch already sent ahead when it was reached.
        assert all(len(w.batches) <= 3 + 1 for w in factory.started)
        await runner.stop()

    run(scenario)


@pytest.mark.parametrize(("batches_per_worker", "timings"), [(3, 5), (1, 3)])
def test_a_worker_s_first_batch_of_a_seeded_size_is_not_its_cost(
    batches_per_worker: int, timings: int
) -> None:
    """A worker's first batch of a size pays its one-off costs (lazy initialisation, cold
    caches): once the size has its seed timings, a replacement's first would make it look
    dear again for a dozen batches. Workers that never run a size twice still seed it."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.ECHO)
        recycle = RecyclePolicy(max_requests=batches_per_worker)
        runner = runner_with(factory, recycle=recycle, batch_size=1)
        runner.start()
        for i in range(6):  # one at a time: batches of one
            job = make_job(f"{i}".encode())
            runner.submit(job)
            await outcomes([job])
        ran = [len(worker.batches) for worker in factory.started]
        assert ran[: 6 // batches_per_worker] == [batches_per_worker] * (6 // batches_per_worker)
        assert runner.queue.costs.timings == {1: timings}
        await runner.stop()

    run(scenario)


def test_recycling_above_a_memory_limit() -> None:
    policy = RecyclePolicy(max_rss_bytes=100 << 20)
    check = policy.check_for(42, rss=lambda pid: 200 << 20)
    assert check is not None and "200 MiB over 100 MiB" in (check(1) or "")
    assert policy.check_for(42, rss=lambda pid: 50 << 20)(1) is None  # type: ignore[misc]
    assert RecyclePolicy().check_for(42) is None


def test_stop_answers_queued_and_held_requests() -> None:
    async def scenario() -> None:
        runner = runner_with(FakeFactory(Behaviour.HANG))
        runner.start()
        await runner.wait_started()
        jobs = [make_job() for _ in range(6)]
        for job in jobs:
            runner.submit(job)
        await wait_until(lambda: len(runner.queue) < 6)
        await runner.stop()
        results = await outcomes(jobs)
        assert all(isinstance(r, NoWorkerAvailable) for r in results)

    run(scenario)


def test_a_poison_request_in_a_batch_fails_alone() -> None:
    """Its batch-mates are retried one at a time and answered; the poison kills the batch's
    worker and then, alone, one more; nothing else fails."""

    async def scenario() -> None:
        factory = FakeFactory(poison=b"poison")
        runner = runner_with(factory, batch_size=4)
        runner.start()
        await runner.wait_started()
        jobs = [make_job(body) for body in (b"a", b"poison", b"c", b"d")]
        for job in jobs:
            runner.submit(job)
        results = await outcomes(jobs)
        assert isinstance(results[1], WorkerDied)
        assert bodies([results[0], results[2], results[3]]) == [b"a", b"c", b"d"]
        assert runner.slots[0].restarts == 2
        await runner.stop()

    run(scenario)


def test_a_request_that_hangs_in_a_batch_times_out_alone() -> None:
    async def scenario() -> None:
        factory = FakeFactory(hang_on=b"hang")
        runner = runner_with(factory, batch_size=4, response_timeout=0.01)
        runner.start()
        await runner.wait_started()
        jobs = [make_job(body) for body in (b"a", b"hang", b"c")]
        for job in jobs:
            runner.submit(job)
        results = await outcomes(jobs)
        assert isinstance(results[1], ResponseTimeout)
        assert bodies([results[0], results[2]]) == [b"a", b"c"]
        await runner.stop()

    run(scenario)


@pytest.mark.parametrize("action", ["reject", "delay"])
def test_a_request_whose_deadline_passes_in_the_queue_is_answered_or_kept_last(
    action: str,
) -> None:
    async def scenario() -> None:
        runner = runner_with(FakeFactory(Behaviour.ECHO), deadline_action=action)
        late, on_time, lowest = make_job(b"late"), make_job(b"on time"), make_job(b"lowest")
        lowest.priority = -100  # the lowest a client may ask for
        for job in (late, on_time, lowest):
            runner.queue.put(job)  # no worker yet: they wait
        late.deadline = 0.0
        runner.deadline_passed(late)
        if action == "reject":
            assert isinstance(late.future.exception(), DeadlineExceeded)
            taken = runner.queue.take_ready() or []  # answered jobs are dropped at dispatch
            assert [job for job in taken if not job.future.done()] == [on_time, lowest]
        else:
            assert not late.future.done() and late.deadline is None
            assert runner.queue.take_ready() == [on_time, lowest, late]
            assert _counter(runner, "ferry_requests_delayed_total") == 1
        on_time.attempts = 1  # sent to a worker, as the dispatcher counts it
        runner.deadline_passed(on_time)  # a worker has it: nothing changes
        assert not on_time.future.done() and on_time.priority == 0

    run(scenario)


@pytest.mark.parametrize("action", ["reject", "delay"])
def test_a_batch_that_would_miss_a_requests_deadline_sheds_or_delays_it(action: str) -> None:
    async def scenario() -> None:
        runner = runner_with(FakeFactory(Behaviour.ECHO), deadline_action=action)
        runner.start()
        await runner.wait_started()
        late, fine = make_job(b"late"), make_job(b"fine")
        late.deadline = time.monotonic() - 1  # past, though its timer has not fired
        runner.submit(late)
        runner.submit(fine)
        results = await outcomes([late, fine])
        if action == "reject":
            assert isinstance(results[0], DeadlineExceeded) and bodies(results) == [b"fine"]
        else:
            assert bodies(results) == [b"late", b"fine"]  # answered, after the batch
            assert _counter(runner, "ferry_requests_delayed_total") == 1
        await runner.stop()

    run(scenario)


def _counter(runner: ModelRunner, name: str) -> float:
    prefix = f'{name}{{model_name="m",model_version="1.0"}} '
    text = runner.metrics.metrics.exposition()
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line.removeprefix(prefix))


def test_requests_whose_client_hung_up_never_reach_a_worker() -> None:
    async def scenario() -> None:
        factory = FakeFactory(Behaviour.ECHO)
        runner = runner_with(factory, batch_size=4)
        runner.start()
        await runner.wait_started()
        jobs = [make_job(body) for body in (b"a", b"gone", b"c")]
        for job in jobs:
            runner.submit(job)
        jobs[1].fail(ClientGone("the client closed the connection"))  # before any dispatch
        results = await outcomes(jobs)
        assert bodies(results) == [b"a", b"c"] and isinstance(results[1], ClientGone)
        sent = [item.request_id for batch in factory.started[0].batches for item in batch.items]
        assert jobs[1].item.request_id not in sent
        await runner.stop()

    run(scenario)


def test_requests_sharing_a_client_chosen_id_each_get_their_own_answer() -> None:
    """Clients choose request ids (x-request-id); two batches held by one worker may carry
    the same one, and each answer must still reach its own request."""

    async def scenario() -> None:
        runner = runner_with(FakeFactory(Behaviour.ECHO), batch_size=1)
        runner.start()
        await runner.wait_started()
        jobs = [make_job(b"first", request_id="same"), make_job(b"second", request_id="same")]
        for job in jobs:
            runner.submit(job)
        assert bodies(await outcomes(jobs)) == [b"first", b"second"]
        await runner.stop()

    run(scenario)


def test_a_lone_request_whose_worker_was_killed_from_outside_is_retried() -> None:
    """SIGKILL from an operator (or the OOM killer) says nothing about the request."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.SIGKILLED, Behaviour.ECHO)
        runner = runner_with(factory)
        runner.start()
        await runner.wait_started()
        job = make_job(b"innocent")
        runner.submit(job)
        assert bodies(await outcomes([job])) == [b"innocent"]
        await runner.stop()

    run(scenario)


def test_a_gpu_fault_is_isolated_as_a_crash_and_named() -> None:
    """A worker leaving with DEVICE_FAILED_EXIT is taken for crashed in its batch: a lone
    request gets the error, which says the GPU failed."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.DEVICE_FAILED, Behaviour.ECHO)
        runner = runner_with(factory)
        runner.start()
        await runner.wait_started()
        culprit = make_job(b"assert")
        runner.submit(culprit)
        (outcome,) = await outcomes([culprit])
        assert isinstance(outcome, WorkerDied) and "GPU" in str(outcome)
        after = make_job(b"fine")
        runner.submit(after)
        assert bodies(await outcomes([after])) == [b"fine"]  # on the replacement
        await runner.stop()

    run(scenario)


@pytest.mark.parametrize("wait", [True, False])
def test_scaling_to_no_worker_answers_what_is_still_queued(wait: bool) -> None:
    """A version scaled to 0 workers while requests wait in its queue (they were routed to
    it before another version became the default): its last worker answers them before it
    stops, rather than leave them queued where no worker will come."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.ECHO)
        runner = runner_with(factory, batch_size=1)
        runner.start()
        await runner.wait_started()
        worker = factory.started[0]
        worker.gate = asyncio.Event()
        jobs = [make_job(f"{i}".encode()) for i in range(4)]
        for job in jobs:
            runner.submit(job)
        await wait_until(lambda: bool(worker.batches))
        scaling = asyncio.ensure_future(runner.scale(0, 1, wait=wait))
        await wait_until(lambda: runner.slots == [])
        assert runner.waiting > 0  # still queued when the worker was retired
        worker.gate.set()
        await scaling
        assert bodies(await outcomes(jobs)) == [f"{i}".encode() for i in range(4)]
        await runner.stop()

    run(scenario)


def test_requests_queued_for_a_worker_retired_while_loading_are_answered() -> None:
    """Scaled to 0 before its only worker came up: nothing will serve what queued meanwhile,
    so it is answered (503) at once instead of waiting for ever."""

    async def scenario() -> None:
        loading = asyncio.Event()

        async def never_loads(worker_spec: Any, timeout: float) -> Any:
            loading.set()
            await asyncio.get_running_loop().create_future()

        runner = runner_with(never_loads, workers=0)
        runner.start()
        await runner.scale(1, 1, wait=False)
        await loading.wait()
        job = make_job(b"x")
        runner.submit(job)
        await runner.scale(0, 0, wait=True)
        (outcome,) = await outcomes([job])
        assert isinstance(outcome, NoWorkerAvailable)
        assert "scaled to 0 workers" in str(outcome)
        await runner.stop()

    run(scenario)


def test_a_model_loaded_on_demand_is_not_served_out_when_evicted_but_loads_again() -> None:
    """An on-demand model admits requests with no worker (they bring a load), so a retired
    worker serving its queue out might never stop, nor its eviction end: it stops after the
    batch in hand, and what is still queued asks for a load."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.ECHO)
        runner = runner_with(factory, batch_size=1, workers=1, load_on_demand=True)
        wanted: list[str] = []
        runner.demand = wanted.append
        await runner.load()
        worker = factory.started[0]
        worker.gate = asyncio.Event()
        jobs = [make_job(f"{i}".encode()) for i in range(4)]
        for job in jobs:
            runner.submit(job)
        await wait_until(lambda: bool(worker.batches))
        wanted.clear()
        eviction = asyncio.ensure_future(runner.scale(0, 1, wait=True))
        await wait_until(lambda: runner.slots == [])
        worker.gate.set()
        await eviction
        answered = [job for job in jobs if job.future.done()]
        assert len(answered) == len(worker.batches) < len(jobs)  # only what it held
        assert wanted == ["m v1.0"]  # the rest brings a load
        await runner.stop()

    run(scenario)


@pytest.mark.parametrize("out_of_memory", [True, False])
def test_a_scale_up_whose_workers_ran_out_of_memory_says_so(out_of_memory: bool) -> None:
    async def scenario() -> None:
        kind = StartFailure.OUT_OF_MEMORY if out_of_memory else StartFailure.LOAD_ERROR
        factory = FakeFactory(Behaviour.ECHO, WorkerStartFailed(kind, "MemoryError: 64 GiB"))
        runner = runner_with(factory)
        runner.start()
        await runner.wait_started()
        with pytest.raises(ModelLoadFailed, match="MemoryError") as failed:
            await runner.scale(2, 2, wait=True)
        assert failed.value.out_of_memory is out_of_memory
        await runner.stop()

    run(scenario)
