"""Batches from a model's queue to one worker, and every answer back to its request.

Whatever a worker holds is kept by request id in an ``InFlight`` table until it is
answered, so no failure can leave a request waiting: when anything goes wrong in an
exchange — the worker dies, hangs past ``response_timeout``, sends a garbled frame, or
delivery itself raises — every request the worker held is retried or answered, and
``serve`` returns for the pool to replace the worker.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ferry.errors import (
    FerryError,
    HandlerFailed,
    InvalidInput,
    NoWorkerAvailable,
    ResponseTimeout,
    WorkerDied,
)
from ferry.metrics.definitions import ModelMetrics
from ferry.scheduling.batch_queue import BatchQueue
from ferry.scheduling.jobs import InferenceResponse, Job
from ferry.worker.handle import WorkerGone, WorkerHandle
from ferry.worker.messages import BatchResult, ItemResult, PredictBatch

log = logging.getLogger("ferry.scheduling")

MAX_ATTEMPTS = 2
"""A request whose worker died is retried once; a second death answers it with an error."""


class ServeEnd(enum.Enum):
    """Why ``Dispatcher.serve`` stopped using a worker."""

    RETIRED = "retired"
    """Its slot was asked to stop (scale-down or shutdown); nothing was lost."""
    RECYCLE = "recycle"
    """It reached its request or memory limit between two batches."""
    EXITED = "exited"
    """It exited while idle."""
    FAILED = "failed"
    """It died, hung or broke the protocol during a batch; its requests were handled."""


class ErrorKind(enum.Enum):
    """How a worker reports one request's failure (``ItemResult.error_kind``)."""

    NONE = ""
    INVALID_INPUT = "invalid_input"
    HANDLER = "handler"


RecycleCheck = Callable[[int], str | None]
"""Given the requests a worker has answered, the reason to replace it now, or None."""


def to_outcome(
    result: ItemResult, batch_size: int, queued_seconds: float = 0.0
) -> InferenceResponse | FerryError:
    """A worker's answer to one request, as the service's response or domain error."""
    kind = ErrorKind(result.error_kind) if result.error_kind in _KINDS else ErrorKind.HANDLER
    if kind is ErrorKind.INVALID_INPUT:
        return InvalidInput(result.message)
    if kind is ErrorKind.HANDLER:
        status = result.status if 400 <= result.status <= 599 else None
        return HandlerFailed(result.message, status)
    return InferenceResponse(
        result.body,
        result.content_type,
        result.status or 200,
        result.headers,
        batch_size,
        queued_seconds,
    )


_KINDS = {kind.value for kind in ErrorKind}


class InFlight:
    """The requests handed to one worker and not yet answered, by request id."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self._jobs[job.item.request_id] = job

    def pop(self, request_id: str) -> Job | None:
        return self._jobs.pop(request_id, None)

    def pop_all(self) -> list[Job]:
        jobs = list(self._jobs.values())
        self._jobs.clear()
        return jobs


@dataclass(frozen=True)
class Exchange:
    """A batch sent to a worker and the moment its answer is due."""

    batch: PredictBatch
    jobs: list[Job]
    deadline: float


class Dispatcher:
    """Feeds one worker at a time (one ``serve`` call per worker) from the model's queue."""

    def __init__(
        self,
        name: str,
        queue: BatchQueue[Job],
        metrics: ModelMetrics,
        response_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.queue = queue
        self.metrics = metrics
        self.response_timeout = response_timeout
        self._clock = clock
        self._batch_ids = 0

    async def serve(
        self,
        worker: WorkerHandle,
        retire: asyncio.Event,
        on_busy: Callable[[bool], None],
        recycle: RecycleCheck | None = None,
    ) -> ServeEnd:
        """Feed batches to ``worker`` until it must go; every request it took is answered
        or back in the queue when this returns (or raises ``CancelledError``)."""
        held = InFlight()
        try:
            return await self._feed(worker, retire, on_busy, held, recycle)
        except asyncio.CancelledError:
            for job in held.pop_all():
                job.fail(NoWorkerAvailable(f"model {self.name} is shutting down"))
            raise
        except TimeoutError:
            log.error(
                "%s worker pid %s exceeded responseTimeout %gs; killing it",
                self.name,
                worker.info.pid,
                self.response_timeout,
            )
            message = f"model {self.name} did not answer within {self.response_timeout:g}s"
            for job in held.pop_all():
                job.fail(ResponseTimeout(message))
        except WorkerGone:
            log.error(
                "%s worker pid %s died holding %d requests", self.name, worker.info.pid, len(held)
            )
            self._retry_or_fail(held.pop_all())
        except Exception:
            # A garbled frame, a mismatched protocol version or a bug in delivery: the
            # worker's state is unknown, so it goes, and what it held is retried.
            log.exception(
                "%s worker pid %s broke the exchange; replacing it", self.name, worker.info.pid
            )
            self._retry_or_fail(held.pop_all())
        return ServeEnd.FAILED

    async def _feed(
        self,
        worker: WorkerHandle,
        retire: asyncio.Event,
        on_busy: Callable[[bool], None],
        held: InFlight,
        recycle: RecycleCheck | None,
    ) -> ServeEnd:
        answered = 0
        exchange: Exchange | None = None
        while True:
            if exchange is None:
                on_busy(False)
                jobs = await self._next_batch(worker, retire)
                if jobs is None:
                    return ServeEnd.RETIRED if retire.is_set() else ServeEnd.EXITED
                exchange = await self._send(worker, jobs, held)
            on_busy(True)
            result = await self._receive(worker, exchange)
            answered += len(exchange.jobs)
            reason = recycle(answered) if recycle is not None else None
            # Start the worker on its next batch before answering this one: the worker
            # never waits while the frontend writes responses.
            ready = None if retire.is_set() or reason else self.queue.take_ready()
            current, exchange = exchange, None
            try:
                if ready:
                    exchange = await self._send(worker, ready, held)
            finally:
                self._deliver(current.jobs, result, held)  # answered even if that send failed
            if reason and exchange is None:
                log.info("%s worker pid %s recycled: %s", self.name, worker.info.pid, reason)
                return ServeEnd.RECYCLE

    async def _next_batch(self, worker: WorkerHandle, retire: asyncio.Event) -> list[Job] | None:
        """The next batch; None if the worker exited or its slot is retired first."""
        take = asyncio.ensure_future(self.queue.take_batch())
        retired = asyncio.ensure_future(retire.wait())
        try:
            await asyncio.wait({take, worker.exited, retired}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            if take.done() and not take.cancelled():
                self.queue.put_front(take.result())  # taken as we were cancelled: not lost
            take.cancel()
            raise
        finally:
            retired.cancel()
        if not take.done():
            take.cancel()  # nothing was taken: cancelling take_batch leaves the queue as it was
            return None
        jobs = take.result()
        if not worker.exited.done() and not retire.is_set():
            return jobs
        self.queue.put_front(jobs)  # taken in the same instant the worker exited or retired
        return None

    async def _send(self, worker: WorkerHandle, jobs: list[Job], held: InFlight) -> Exchange:
        self._batch_ids += 1
        batch = PredictBatch(self._batch_ids, [job.item for job in jobs])
        now = self._clock()
        for job in jobs:
            if job.attempts == 0:
                job.queued_seconds = now - job.enqueued_at
            job.attempts += 1
        held.add(jobs)
        self.metrics.dispatched((job.queued_seconds for job in jobs), len(jobs))
        exchange = Exchange(batch, jobs, now + self.response_timeout)
        # Bounded like the answer: a worker that stopped reading must not hold us forever.
        await asyncio.wait_for(worker.send(batch), self._remaining(exchange))
        return exchange

    async def _receive(self, worker: WorkerHandle, exchange: Exchange) -> BatchResult:
        result = await asyncio.wait_for(worker.receive(), self._remaining(exchange))
        if result.batch_id != exchange.batch.batch_id:
            raise WorkerGone(
                f"worker {worker.info.pid} answered batch {result.batch_id}, "
                f"expected {exchange.batch.batch_id}"
            )
        return result

    def _remaining(self, exchange: Exchange) -> float:
        return max(0.0, exchange.deadline - self._clock())

    def _deliver(self, jobs: list[Job], result: BatchResult, held: InFlight) -> None:
        log.debug("%s: batch of %d, handler %.1f ms", self.name, len(jobs), result.handler_ms)
        self.metrics.stages(result.stage_ms)
        for metric in result.metrics:
            self.metrics.handler_metric(
                metric.name, metric.value, metric.unit, metric.kind, metric.dimensions
            )
        for item in result.results:
            job = held.pop(item.request_id)
            if job is None:
                log.warning("%s: result for unknown request %s ignored", self.name, item.request_id)
                continue
            outcome = to_outcome(item, len(jobs), job.queued_seconds)
            if isinstance(outcome, FerryError):
                job.fail(outcome)
            else:
                job.resolve(outcome)
        for job in jobs:
            if held.pop(job.item.request_id) is not None:
                job.fail(HandlerFailed("worker returned no result for this request"))

    def _retry_or_fail(self, jobs: list[Job]) -> None:
        retry = [job for job in jobs if job.attempts < MAX_ATTEMPTS and not job.future.done()]
        for job in jobs:
            if job not in retry:
                job.fail(WorkerDied(f"worker of model {self.name} died while handling the request"))
        if retry:
            self.queue.put_front(retry)

    def fail_queued(self, error: FerryError) -> None:
        """Answer everything still queued with ``error``."""
        for job in self.queue.drain():
            job.fail(error)
