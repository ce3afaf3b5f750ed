"""The request path's one hook point (``ferry.scheduling.observers``) against fake workers
and an observer that writes down what it is told: every request it watches ends once,
however it ends (answered, refused, failed, given up on by its client, retried after its
worker died); every batch of watched requests is watched and ends; unwatched requests
never reach it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from ferry.errors import FerryError, NoWorkerAvailable, WorkerDied
from ferry.scheduling.jobs import Job, Prediction, RequestWatch
from ferry.scheduling.model_runner import ModelRunner
from ferry.scheduling.observers import watch_request
from ferry.wire.messages import InputPart, StageWindow
from ferry.worker_handles.handle import WorkerFactory
from tests.fixtures.fake_worker import Behaviour, FakeFactory, FakeWorker, make_job, outcomes
from tests.unit.test_scheduling_core import run, runner_with, wait_until

STOP_GUARD = 10.0
"""Seconds a runner's stop may take before the test calls it hung."""


class Seen:
    """What an observer was told, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def ends_of(self, request_id: str) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == "request ended" and e[1] == request_id]


class RequestSeen:
    def __init__(self, seen: Seen, request_id: str) -> None:
        self.seen, self.request_id = seen, request_id

    @property
    def ids(self) -> tuple[str, str]:
        return ("trace-" + self.request_id, "span")

    def ended(self, outcome: Prediction | BaseException, queued_seconds: float) -> None:
        self.seen.events.append(("request ended", self.request_id, outcome, queued_seconds))


class BatchSeen:
    def __init__(self, seen: Seen, batch_id: int) -> None:
        self.seen, self.batch_id = seen, batch_id

    @property
    def traceparent(self) -> str:
        return f"batch-{self.batch_id}"

    def ended(self, windows: Sequence[StageWindow], error: BaseException | None = None) -> None:
        self.seen.events.append(("batch ended", self.batch_id, error))


class Recording:
    """Watches the requests whose id does not start with ``skip``."""

    def __init__(self, skip: str = "untraced") -> None:
        self.seen = Seen()
        self.skip = skip

    def request(
        self, model: str, version: str, request_id: str, headers: Mapping[str, str]
    ) -> RequestWatch | None:
        if request_id.startswith(self.skip):
            return None
        self.seen.events.append(("request taken", request_id, model, version))
        return RequestSeen(self.seen, request_id)

    def batch(
        self,
        model: str,
        batch_id: int,
        size: int,
        requests: Sequence[RequestWatch],
        worker: Mapping[str, str | int],
    ) -> BatchSeen:
        ids = sorted(r.request_id for r in requests if isinstance(r, RequestSeen))
        self.seen.events.append(("batch sent", batch_id, ids))
        return BatchSeen(self.seen, batch_id)


def observed_runner(factory: WorkerFactory, observer: Recording, **overrides: Any) -> ModelRunner:
    return runner_with(factory, observer, **overrides)


def enqueue(runner: ModelRunner, request_id: str) -> Job:
    return runner.enqueue(request_id, {}, [InputPart("body", "text/plain", request_id.encode())])


def test_an_answered_request_ends_once_with_its_answer_and_names_its_ids() -> None:
    observer = Recording()

    async def scenario() -> None:
        runner = observed_runner(FakeFactory(Behaviour.ECHO), observer)
        runner.start()
        await runner.wait_started()
        (answer,) = await outcomes([enqueue(runner, "a")])
        assert isinstance(answer, Prediction) and answer.trace_ids == ("trace-a", "span")
        await runner.stop()

    run(scenario)
    events = observer.seen.events
    assert events[0] == ("request taken", "a", "m", "1.0")
    assert ("batch sent", 1, ["a"]) in events and ("batch ended", 1, None) in events
    (end,) = observer.seen.ends_of("a")
    assert isinstance(end[2], Prediction) and end[2].body == b"a"


def test_a_request_the_runner_refuses_ends_with_the_refusal() -> None:
    observer = Recording()

    async def scenario() -> None:
        runner = observed_runner(FakeFactory(Behaviour.ECHO), observer)  # never started
        with pytest.raises(FerryError) as refusal:
            enqueue(runner, "refused")
        (end,) = observer.seen.ends_of("refused")
        assert end[2] is refusal.value

    run(scenario)
    assert not [e for e in observer.seen.events if e[0] == "batch sent"]


def test_a_batch_whose_worker_died_ends_with_the_error_and_its_retries_are_watched() -> None:
    observer = Recording()

    async def scenario() -> None:
        runner = observed_runner(FakeFactory(Behaviour.EXIT, Behaviour.ECHO), observer)
        runner.start()
        await runner.wait_started()
        answers = await outcomes([enqueue(runner, "x"), enqueue(runner, "y")])
        assert [a.body for a in answers if isinstance(a, Prediction)] == [b"x", b"y"]
        await runner.stop()

    run(scenario)
    events = observer.seen.events
    assert ("batch sent", 1, ["x", "y"]) in events
    (first_end,) = [e for e in events if e[:2] == ("batch ended", 1)]
    assert isinstance(first_end[2], WorkerDied)
    retries = [e for e in events if e[0] == "batch sent" and e[1] != 1]
    assert sorted(tuple(e[2]) for e in retries) == [("x",), ("y",)]  # each alone, watched
    for request_id in ("x", "y"):
        (end,) = observer.seen.ends_of(request_id)  # once, with the retry's answer
        assert isinstance(end[2], Prediction)


def test_a_request_its_client_gave_up_on_ends_cancelled() -> None:
    observer = Recording()

    async def scenario() -> None:
        runner = observed_runner(FakeFactory(Behaviour.HANG), observer, response_timeout=30.0)
        runner.start()
        await runner.wait_started()
        job = enqueue(runner, "gone")
        job.future.cancel()
        await runner.stop()

    run(scenario)
    (end,) = observer.seen.ends_of("gone")
    assert isinstance(end[2], asyncio.CancelledError)


def test_a_batch_abandoned_when_its_worker_is_dropped_ends_as_its_request_does() -> None:
    """The dispatcher's ``serve`` cancelled (the server stopping) while its worker holds a
    batch: the batch's watch ends, cancelled, and its request is answered."""
    observer = Recording()

    async def scenario() -> None:
        runner = observed_runner(FakeFactory(Behaviour.HANG), observer, response_timeout=30.0)
        job = make_job(b"held", "held")
        watch_request(observer, "m", "1.0", job)
        runner.dispatcher.queue.put(job)
        worker = FakeWorker(Behaviour.HANG)
        serving = asyncio.create_task(
            runner.dispatcher.serve(worker, asyncio.Event(), lambda busy: None)
        )
        await wait_until(lambda: ("batch sent", 1, ["held"]) in observer.seen.events)
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        (answer,) = await outcomes([job])
        assert isinstance(answer, NoWorkerAvailable)

    run(scenario)
    (batch_end,) = [e for e in observer.seen.events if e[0] == "batch ended"]
    assert isinstance(batch_end[2], asyncio.CancelledError)
    (end,) = observer.seen.ends_of("held")
    assert isinstance(end[2], NoWorkerAvailable)


def test_a_stop_as_a_batch_is_sent_answers_its_request_at_once() -> None:
    """The stop's cancellation comes while the dispatcher awaits the send (the observer's
    "batch sent" is the moment before). Python 3.11's ``wait_for`` could drop it when the
    send completed in the same turn: the stop then waited for ``response_timeout`` and the
    request was answered ``ResponseTimeout`` (seen once in a script: 30.03 s against
    0.0001 s now; under pytest the old code's race is not hit every time). It answers
    "shutting down" at once."""
    observer = Recording()

    async def scenario() -> None:
        runner = observed_runner(FakeFactory(Behaviour.HANG), observer, response_timeout=60.0)
        runner.start()
        await runner.wait_started()
        job = enqueue(runner, "held")
        await wait_until(lambda: ("batch sent", 1, ["held"]) in observer.seen.events)
        # A hang guard, far above the milliseconds a stop takes: the dropped cancellation
        # held it for tens of seconds.
        await asyncio.wait_for(runner.stop(), STOP_GUARD)
        (answer,) = await outcomes([job])
        assert isinstance(answer, NoWorkerAvailable), answer

    run(scenario)


def test_unwatched_requests_never_reach_the_observer() -> None:
    observer = Recording(skip="untraced")

    async def scenario() -> None:
        runner = observed_runner(FakeFactory(Behaviour.ECHO), observer)
        runner.start()
        await runner.wait_started()
        jobs = [
            enqueue(runner, "untraced-1"),
            enqueue(runner, "traced"),
            enqueue(runner, "untraced-2"),
        ]
        await outcomes(jobs)
        await runner.stop()

    run(scenario)
    mentioned = [e for e in observer.seen.events if "untraced" in repr(e)]
    assert mentioned == []
    assert ("batch sent", 1, ["traced"]) in observer.seen.events


def test_a_request_the_runner_is_told_not_to_show_is_never_watched() -> None:
    observer = Recording()

    async def scenario() -> None:
        runner = observed_runner(FakeFactory(Behaviour.ECHO), observer)
        runner.start()
        await runner.wait_started()
        job = runner.enqueue("describe", {"describe": "True"}, [], alone=True, watched=False)
        await outcomes([job])
        await runner.stop()

    run(scenario)
    assert observer.seen.events == []


def test_a_batch_the_worker_never_took_ends_with_the_error() -> None:
    observer = Recording()

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.STOP_READING, Behaviour.ECHO)
        runner = observed_runner(factory, observer, response_timeout=0.2)
        runner.start()
        await runner.wait_started()
        (answer,) = await outcomes([enqueue(runner, "stuck")])
        assert isinstance(answer, (Prediction, FerryError))
        await runner.stop()

    run(scenario)
    sent = [e[1] for e in observer.seen.events if e[0] == "batch sent"]
    ended = [e[1] for e in observer.seen.events if e[0] == "batch ended"]
    assert sent and sorted(sent) == sorted(ended)  # the one never read ended too
    assert observer.seen.events[-1][0] == "request ended"
