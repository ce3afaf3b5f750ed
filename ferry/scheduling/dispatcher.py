"""Batches from a model's queue to one worker, and every answer back to its request.

Whatever a worker holds is kept by request id in an ``InFlight`` table until it is
answered, so no failure can leave a request waiting: when anything goes wrong in an
exchange — the worker dies, hangs past ``response_timeout``, sends a garbled frame, or
delivery itself raises — every request the worker held is retried or answered, and
``serve`` returns for the pool to replace the worker (``ferry.scheduling.retries`` says
which are retried). What one worker holds is ``ferry.scheduling.lanes``; when its answers
are due, ``ferry.scheduling.timeouts``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable

from ferry.errors import (
    DeadlineExceeded,
    FerryError,
    HandlerFailed,
    InvalidInput,
    NoWorkerAvailable,
    ResponseTimeout,
    WorkerDied,
)
from ferry.metrics.definitions import ModelMetrics
from ferry.scheduling.batch_queue import BatchQueue
from ferry.scheduling.jobs import LATE_PRIORITY, Job, Prediction, PredictionPart
from ferry.scheduling.lanes import BatchSource, Exchange, InFlight, Lane, RecycleCheck, give_back
from ferry.scheduling.observers import BatchWatch, Observer
from ferry.scheduling.retries import isolate_or_fail, requeue_unstarted
from ferry.scheduling.sequences import SequenceBook
from ferry.scheduling.timeouts import BatchTimeouts
from ferry.wire.codec import ProtocolError
from ferry.wire.messages import (
    DEVICE_FAILED_EXIT,
    BatchResult,
    ErrorKind,
    ItemResult,
    PartialResult,
    PredictBatch,
)
from ferry.worker_handles.handle import WorkerGone, WorkerHandle

log = logging.getLogger("ferry.scheduling")

EXIT_STATUS_WAIT = 5.0
"""Seconds to wait for a dead worker's exit status (it arrives right after its socket closes)."""


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


BusyReport = Callable[[bool], None]
"""Told whether the worker is busy: False as it waits for a batch, True as it gets one."""


def to_outcome(
    result: ItemResult,
    batch_size: int,
    queued_seconds: float = 0.0,
    trace_ids: tuple[str, str] | None = None,
) -> Prediction | FerryError:
    """A worker's answer to one request, as the service's response or domain error;
    ``trace_ids``: its observer's ids, for its access line."""
    if result.error_kind is ErrorKind.INVALID_INPUT:
        return InvalidInput(result.message)
    if result.error_kind is ErrorKind.HANDLER:
        status = result.status if 400 <= result.status <= 599 else None
        return HandlerFailed(result.message, status)
    return Prediction(
        result.body,
        result.content_type,
        result.status or 200,
        result.headers,
        batch_size,
        queued_seconds,
        result.request_id,
        trace_ids,
    )


class Dispatcher:
    """Feeds one worker at a time (one ``serve`` call per worker) from the model's queue."""

    def __init__(
        self,
        name: str,
        queue: BatchQueue[Job],
        metrics: ModelMetrics,
        response_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        delay_late: bool = False,
        stream_timeout: float | None = None,
        cancel_grace: float = 5.0,
        sequences: SequenceBook | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.name = name
        self.observer = observer
        """What watches its batches (``ferry.scheduling.observers``), if anything."""
        self.sequences = sequences
        """A stateful model's sequences: each worker takes batches from its own."""
        self.delay_late = delay_late
        """``deadlineAction: delay``: a request whose batch would miss its deadline goes
        back to the queue, last in line, instead of being answered ``DeadlineExceeded``."""
        self.queue = queue
        self.metrics = metrics
        self.timeouts = BatchTimeouts(response_timeout, stream_timeout, cancel_grace, clock)
        self._clock = clock
        self._batch_ids = 0
        self._idle_workers = 0
        """Workers waiting for a batch right now."""
        self.suspects: BatchQueue[Job] = BatchQueue(1, 0.0, queue.capacity, clock)
        """Requests of a batch whose worker failed, each to be retried alone."""

    async def serve(
        self,
        worker: WorkerHandle,
        retire: asyncio.Event,
        on_busy: BusyReport,
        recycle: RecycleCheck | None = None,
        *,
        last_out: Callable[[], bool] = lambda: False,
    ) -> ServeEnd:
        """Feed batches to ``worker`` until it must go; every request it took is answered
        or back in the queue when this returns (or raises ``CancelledError``). Retired
        while ``last_out()``, it first answers what is queued."""
        if self.sequences is None:
            lane = Lane(self.queue, recycle=recycle, last_out=last_out)
            return await self._serve(worker, retire, on_busy, lane)
        sequences = self.sequences.lane()
        try:
            return await self._serve(worker, retire, on_busy, Lane(sequences, recycle=recycle))
        finally:  # its sequences go on, on another worker
            sequences.close()

    async def _serve(
        self, worker: WorkerHandle, retire: asyncio.Event, on_busy: BusyReport, lane: Lane
    ) -> ServeEnd:
        try:
            return await self._feed(worker, retire, on_busy, lane)
        except asyncio.CancelledError as cancelled:
            self._shutting_down(lane, cancelled)
            raise
        except TimeoutError:
            error, lone_is_culprit = self._timed_out(worker, lane), True
        except WorkerGone:
            status = await self._exit_status(worker, lane)
            error, lone_is_culprit = self._gone(worker, lane, status)
        except Exception:
            # A garbled frame, a mismatched protocol version or a bug in delivery: the
            # worker's state is unknown, so it goes, and what it held is retried.
            log.exception(
                "%s worker pid %s broke the exchange; replacing it", self.name, worker.info.pid
            )
            error, lone_is_culprit = self._died(), True
        _ended(lane.pending, error)
        started, waiting = lane.started_and_waiting()
        retried = isolate_or_fail(started, error, lone_is_culprit, self.suspects)
        if retried:
            log.warning(
                "%s: retrying the %d requests of the failed batch one at a time", self.name, retried
            )
        requeue_unstarted(waiting, error, lane.source)
        return ServeEnd.FAILED

    def _timed_out(self, worker: WorkerHandle, lane: Lane) -> FerryError:
        reason = self.timeouts.overdue(lane.pending[0]) if lane.pending else "timed out"
        log.error(
            "%s worker pid %s %s holding %d requests; killing it",
            self.name,
            worker.info.pid,
            reason,
            lane.started_count(),
        )
        return ResponseTimeout(f"model {self.name} {reason}")

    async def _exit_status(self, worker: WorkerHandle, lane: Lane) -> object:
        """A dead worker's exit status (None if it does not come in time)."""
        try:
            return await self._status(worker)
        except asyncio.CancelledError as cancelled:
            self._shutting_down(lane, cancelled)
            raise

    def _gone(self, worker: WorkerHandle, lane: Lane, status: object) -> tuple[FerryError, bool]:
        """The error for what a dead worker held, and whether a lone request is taken
        for the culprit: not when the worker was killed from outside (SIGKILL or SIGTERM
        from an operator or the OOM killer), where the batch need not be the cause, so
        even a lone request gets its one retry."""
        log.error(
            "%s worker pid %s died holding %d requests",
            self.name,
            worker.info.pid,
            lane.started_count(),
        )
        if status == DEVICE_FAILED_EXIT:
            error = WorkerDied(
                f"the GPU of a worker of model {self.name} failed while handling the request "
                "(a device-side assert or illegal memory access: see the worker's log)"
            )
            return error, True
        return self._died(), status not in (-signal.SIGKILL, -signal.SIGTERM)

    def _shutting_down(self, lane: Lane, cancelled: asyncio.CancelledError) -> None:
        """``serve`` was cancelled (a shutdown): what the worker held is answered, and
        the watches of its batches end."""
        _ended(lane.pending, cancelled)
        for job in lane.held.pop_all():
            job.fail(NoWorkerAvailable(f"model {self.name} is shutting down"))

    async def _feed(
        self, worker: WorkerHandle, retire: asyncio.Event, on_busy: BusyReport, lane: Lane
    ) -> ServeEnd:
        """``serve``'s loop: batch after batch, the next one sent before this one is answered."""
        pending = lane.pending
        while True:
            if not pending:
                on_busy(False)
                jobs = await self._next_when_idle(worker, retire, lane)
                if jobs is None:
                    return ServeEnd.RETIRED if retire.is_set() else ServeEnd.EXITED
                if not jobs:
                    continue
                pending.append(await self._send(worker, jobs, lane.held))
            on_busy(True)
            ahead = self._full_batch_to_send_ahead(lane, retire)
            if ahead:
                pending.append(await self._send(worker, ahead, lane.held))
            result = await self._receive(worker, pending[0])
            current = self._pop_answered(pending)
            lane.note_answered(current)
            try:
                # Start the worker on its next batch before answering this one: the worker
                # never waits while the frontend writes responses.
                ready = self._batch_to_start_next(lane, retire)
                if ready:
                    pending.append(await self._send(worker, ready, lane.held))
            finally:  # even if that send failed
                self._deliver(current, result, lane.held, workers_first=lane.note_size(current))
            if lane.recycling and not pending:
                log.info(
                    "%s worker pid %s recycled: %s", self.name, worker.info.pid, lane.recycling
                )
                return ServeEnd.RECYCLE

    async def _next_when_idle(
        self, worker: WorkerHandle, retire: asyncio.Event, lane: Lane
    ) -> list[Job] | None:
        """An idle worker's next batch, less requests answered while they waited (maybe
        none left); None when the worker must stop."""
        jobs = await self._next_batch(worker, retire, lane.source)
        if jobs is None and self._drains(worker, retire, lane):
            jobs = await self._next_batch(worker, None, lane.source)
        return None if jobs is None else self._still_wanted(jobs, lane.source)

    def _drains(self, worker: WorkerHandle, retire: asyncio.Event, lane: Lane) -> bool:
        """Whether a retired worker takes one more batch: requests wait that no other
        worker will come for (they were queued before the model was scaled to 0)."""
        queued = len(lane.source) + len(self.suspects)
        return retire.is_set() and not worker.exited.done() and queued > 0 and lane.last_out()

    def _full_batch_to_send_ahead(self, lane: Lane, retire: asyncio.Event) -> list[Job] | None:
        """A batch to send while the worker is still on its only one, when saturated (a
        full batch waits and no worker is idle): sent now, the worker starts on it the
        moment it finishes, however busy our event loop. None while the worker is retired
        or recycled."""
        if len(lane.pending) != 1 or retire.is_set() or lane.recycling or self._idle_workers:
            return None
        if self.suspects or len(lane.source) < lane.source.batch_size:
            return None
        return self._still_wanted(lane.source.take_ready() or [], lane.source)

    def _pop_answered(self, pending: deque[Exchange]) -> Exchange:
        """Take the answered batch off ``pending``; the worker starts on the one behind it
        now, so that one's time to answer counts from here."""
        current = pending.popleft()
        if pending:
            pending[0].started_at = self._clock()
            pending[0].deadline = self.timeouts.due(pending[0].started_at)
        return current

    def _batch_to_start_next(self, lane: Lane, retire: asyncio.Event) -> list[Job] | None:
        """The batch for the worker to start on once it answered its last one; None if it
        still holds one, or is retired or recycled."""
        if lane.pending or retire.is_set() or lane.recycling:
            return None
        return self._take_ready(lane.source)

    def _still_wanted(self, jobs: list[Job], source: BatchSource) -> list[Job]:
        """Drop requests answered while they waited (their client hung up, or their
        deadline passed), and shed those whose deadline the batch cannot meet: they never
        reach a worker."""
        wanted = [job for job in jobs if not job.future.done()]
        if len(wanted) < len(jobs):
            self.metrics.abandoned(len(jobs) - len(wanted))
        finish = self._clock() + self.queue.expected_cost(len(wanted))
        late = [job for job in wanted if job.deadline is not None and job.deadline < finish]
        if not late:
            return wanted
        if self.delay_late:
            for job in late:
                job.priority, job.deadline = LATE_PRIORITY, None
            source.put_front(late)
            self.metrics.delayed(len(late))
        else:
            for job in late:
                job.fail(
                    DeadlineExceeded("the request's deadline cannot be met: shed before its batch")
                )
        return [job for job in wanted if job not in late]

    def _take_ready(self, source: BatchSource) -> list[Job] | None:
        """A batch to send right now, suspects (one at a time) first."""
        return self._still_wanted(self.suspects.take_ready() or source.take_ready() or [], source)

    async def _next_batch(
        self, worker: WorkerHandle, retire: asyncio.Event | None, source: BatchSource
    ) -> list[Job] | None:
        """The next batch (a lone suspect first); None if the worker exited or its slot is
        retired first (``retire`` None: however retired it is)."""
        takes: dict[asyncio.Future[list[Job]], BatchSource] = {
            asyncio.ensure_future(self.suspects.take_batch()): self.suspects,
            asyncio.ensure_future(source.take_batch()): source,
        }
        retired = asyncio.ensure_future(
            retire.wait() if retire is not None else asyncio.get_running_loop().create_future()
        )
        self._idle_workers += 1
        try:
            await asyncio.wait(
                {*takes, worker.exited, retired}, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            give_back(takes, keep=None)  # taken as we were cancelled: not lost
            raise
        finally:
            self._idle_workers -= 1
            retired.cancel()
        serving = not worker.exited.done() and (retire is None or not retire.is_set())
        chosen = next((take for take in takes if take.done()), None) if serving else None
        give_back(takes, keep=chosen)
        return chosen.result() if chosen is not None else None

    async def _send(self, worker: WorkerHandle, jobs: list[Job], held: InFlight) -> Exchange:
        self._batch_ids += 1
        watch = self._batch_watch(worker, jobs)
        traceparent = watch.traceparent if watch is not None else ""
        batch = PredictBatch(self._batch_ids, [job.item for job in jobs], traceparent)
        now = self._clock()
        for job in jobs:
            if job.attempts == 0:
                job.queued_seconds = now - job.enqueued_at
            job.attempts += 1
        held.add(jobs)
        self.metrics.dispatched((job.queued_seconds for job in jobs), len(jobs))
        exchange = Exchange(batch, jobs, self.timeouts.due(now), now, watch=watch)
        # Bounded like the answer: a worker that stopped reading must not hold us forever.
        # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that
        # comes as the call completes, and a server stopping then waited response_timeout.
        try:
            async with asyncio.timeout(self.timeouts.remaining(exchange)):
                await worker.send(batch)
        except BaseException as error:  # never pending, so its watch ends here
            _ended([exchange], error)
            raise
        return exchange

    def _batch_watch(self, worker: WorkerHandle, jobs: list[Job]) -> BatchWatch | None:
        """The observer's watch on the batch, when it watches any of its requests."""
        if self.observer is None:  # tracing off: nothing to gather, batch after batch
            return None
        watched = [job.watch for job in jobs if job.watch is not None]
        if not watched:
            return None
        details: dict[str, str | int] = {"pid": worker.info.pid or 0, "device": worker.info.device}
        return self.observer.batch(self.name, self._batch_ids, len(jobs), watched, details)

    async def _receive(self, worker: WorkerHandle, exchange: Exchange) -> BatchResult:
        """The batch's result; parts its handler streamed first go to their jobs."""
        while True:
            async with asyncio.timeout(self.timeouts.remaining(exchange)):
                message = await worker.receive()
            if message.batch_id != exchange.batch.batch_id:
                raise ProtocolError(
                    f"worker {worker.info.pid} answered batch {message.batch_id}, "
                    f"expected {exchange.batch.batch_id}"
                )
            if isinstance(message, BatchResult):
                return message
            self._pass_on(worker, exchange, message)
            exchange.deadline = self.timeouts.after_part(exchange)
            if self._clock() >= exchange.deadline:
                raise TimeoutError  # a stream that never pauses is cut off all the same

    def _pass_on(self, worker: WorkerHandle, exchange: Exchange, part: PartialResult) -> None:
        job = next((j for j in exchange.jobs if j.item.request_id == part.request_id), None)
        if job is None:
            raise ProtocolError(f"worker streamed a part for unknown request {part.request_id}")
        if job.future.done():  # its client went away, or fell too far behind the stream
            self._cancel(worker, exchange, job)
        else:
            job.stream(PredictionPart(part.body, part.content_type, part.status, part.request_id))

    def _cancel(self, worker: WorkerHandle, exchange: Exchange, job: Job) -> None:
        """Tell the worker (once) to stop streaming to ``job``; when no request of the
        batch is left to answer, it has ``cancel_grace`` to stop, or it is replaced."""
        if any(job is cancelled for cancelled in exchange.cancelled):
            return
        exchange.cancelled.append(job)
        worker.cancel(exchange.batch.batch_id, [job.item.request_id])
        if exchange.abandoned_at is None and all(j.future.done() for j in exchange.jobs):
            self.timeouts.abandon(exchange)
            log.info(
                "%s worker pid %s: every client of batch %d went away; cancelling it",
                self.name,
                worker.info.pid,
                exchange.batch.batch_id,
            )

    def _deliver(
        self, exchange: Exchange, result: BatchResult, held: InFlight, *, workers_first: bool
    ) -> None:
        """Answer the batch's requests (``workers_first``: the worker's first batch of its
        size, which the cost model weighs apart)."""
        jobs = exchange.jobs
        if exchange.watch is not None:
            exchange.watch.ended(result.stage_windows)
        log.debug("%s: batch of %d, handler %.1f ms", self.name, len(jobs), result.handler_ms)
        self.metrics.stages(result.stage_ms)
        round_trip_ms = (self._clock() - exchange.started_at) * 1000
        self.metrics.batch_done(result.handler_ms, max(0.0, round_trip_ms - result.handler_ms))
        # What a batch of this size occupies a worker for: the batch policy's evidence.
        self.queue.batch_timed(len(jobs), round_trip_ms / 1000, workers_first=workers_first)
        for metric in result.metrics:
            self.metrics.handler_metric(
                metric.name, metric.value, metric.unit, metric.kind, metric.dimensions
            )
        by_id = {job.item.request_id: job for job in jobs}
        for item in result.results:
            job = by_id.pop(item.request_id, None)
            if job is None:
                log.warning("%s: result for unknown request %s ignored", self.name, item.request_id)
                continue
            held.discard(job)
            ids = job.watch.ids if job.watch is not None else None
            outcome = to_outcome(item, len(jobs), job.queued_seconds, ids)
            if isinstance(outcome, FerryError):
                job.fail(outcome)
            else:
                job.resolve(outcome)
        for job in by_id.values():
            if held.discard(job):
                job.fail(HandlerFailed("worker returned no result for this request"))

    def _died(self) -> WorkerDied:
        return WorkerDied(f"worker of model {self.name} died while handling the request")

    @staticmethod
    async def _status(worker: WorkerHandle) -> object:
        """The worker's exit status, awaited for a bounded moment (the connection closes
        just before the process is reaped); None if it does not come."""
        try:
            return await asyncio.wait_for(asyncio.shield(worker.exited), EXIT_STATUS_WAIT)
        except TimeoutError:
            return None

    def put_alone(self, job: Job) -> None:
        """Queue ``job`` to run alone in its batch, ahead of the main queue (the lane that
        suspects take)."""
        self.suspects.put(job)

    def fail_queued(self, error: FerryError) -> None:
        """Answer everything still queued (suspects included) with ``error``."""
        sequenced = self.sequences.drain() if self.sequences is not None else []
        for job in [*self.suspects.drain(), *self.queue.drain(), *sequenced]:
            job.fail(error)


def _ended(exchanges: Iterable[Exchange], error: BaseException) -> None:
    """Batches that failed, or that a shutdown abandoned: their watches end."""
    for exchange in exchanges:
        if exchange.watch is not None:
            exchange.watch.ended([], error)
