"""One model version: its queue and the worker slots that drain it.

Each slot owns at most one worker process at a time. A slot whose worker crashes,
is killed or hangs past ``response_timeout`` starts a replacement (with backoff); the
requests that worker held are retried once on a healthy worker, or answered with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from ferry.errors import (
    FerryError,
    HandlerFailed,
    InvalidInput,
    NoWorkerAvailable,
    ResponseTimeout,
    WorkerDied,
)
from ferry.metrics.definitions import FerryMetrics, ModelMetrics
from ferry.scheduling.batch_queue import BatchQueue
from ferry.scheduling.jobs import InferenceResponse, Job
from ferry.scheduling.placement import worker_gpu
from ferry.worker.messages import BatchResult, ItemResult, PredictBatch
from ferry.worker.process import WorkerGone, WorkerProcess, WorkerStartFailed
from ferry.worker.spec import WorkerSpec

log = logging.getLogger("ferry.scheduling")

MAX_ATTEMPTS = 2
"""A request whose worker died is retried once; a second death answers it with an error."""


@dataclass(frozen=True)
class RunnerSettings:
    batch_size: int
    max_batch_delay: float
    """Seconds."""
    workers: int
    """Workers to keep running (TorchServe's minWorkers)."""
    response_timeout: float
    startup_timeout: float
    queue_capacity: int
    torch_threads: int
    gpu_ids: tuple[int, ...] = ()
    max_workers: int = 0
    """TorchServe's maxWorkers, reported by describe; Ferry runs ``workers`` processes."""


class Backoff:
    """Restart delays: 0.1 s doubling to 10 s, reset once a worker comes up."""

    def __init__(self, first: float = 0.1, cap: float = 10.0) -> None:
        self.first, self.cap = first, cap
        self.delay = 0.0

    def next(self) -> float:
        self.delay = self.first if self.delay == 0 else min(self.cap, self.delay * 2)
        return self.delay

    def reset(self) -> None:
        self.delay = 0.0


@dataclass
class WorkerSlot:
    index: int
    state: str = "starting"  # starting | ready | busy | restarting | failed | stopped
    worker: WorkerProcess | None = None
    restarts: int = 0
    last_error: str = ""
    ready_since: float | None = None
    """Wall-clock time (epoch seconds) its current worker became ready."""
    retire: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set when scaling down: finish the batch in hand, then stop."""
    task: asyncio.Task[None] | None = field(default=None, repr=False)


def _to_outcome(
    result: ItemResult, batch_size: int, queued_seconds: float = 0.0
) -> InferenceResponse | FerryError:
    if result.error_kind == "invalid_input":
        return InvalidInput(result.message)
    if result.error_kind:
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


class ModelRunner:
    """Serves one model version with ``settings.workers`` worker processes."""

    def __init__(
        self,
        name: str,
        version: str,
        spec: WorkerSpec,
        settings: RunnerSettings,
        metrics: ModelMetrics | None = None,
    ) -> None:
        self.name = name
        self.metrics = metrics or FerryMetrics(enabled=False).for_model(name, version)
        self.version = version
        self.spec = spec
        self.settings = settings
        self.queue: BatchQueue[Job] = BatchQueue(
            settings.batch_size, settings.max_batch_delay, settings.queue_capacity
        )
        self.slots: list[WorkerSlot] = []
        self.max_workers = max(settings.max_workers, settings.workers)
        self._slot_ids = 0
        self._batch_ids = 0
        self._stopping = False
        self._first_attempt = asyncio.Event()

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        for _ in range(self.settings.workers):
            self._add_slot()

    def _add_slot(self) -> WorkerSlot:
        slot = WorkerSlot(self._slot_ids)
        self._slot_ids += 1
        slot.task = asyncio.create_task(self._run_slot(slot), name=f"{self.name}-w{slot.index}")
        self.slots.append(slot)
        return slot

    async def wait_started(self, slots: list[WorkerSlot] | None = None) -> None:
        """Until every slot (or those given) has tried its first start, successfully or not."""
        while any(slot.state == "starting" for slot in (self.slots if slots is None else slots)):
            self._first_attempt.clear()
            await self._first_attempt.wait()

    async def scale(self, workers: int, max_workers: int, *, wait: bool) -> None:
        """Run ``workers`` processes. Retired workers finish the batch they hold first, so
        scaling down under load fails no request."""
        self.max_workers = max(max_workers, workers)
        added = [self._add_slot() for _ in range(workers - len(self.slots))]
        retired, self.slots = self.slots[workers:], self.slots[:workers]
        for slot in retired:
            slot.retire.set()
        if wait:
            await self.wait_started(added)
            await asyncio.gather(*(slot.task for slot in retired if slot.task is not None))

    async def stop(self) -> None:
        """Stop every worker and answer whatever is still queued; returns once workers exited."""
        self._stopping = True
        workers = [slot.worker for slot in self.slots if slot.worker is not None]
        for slot in self.slots:
            if slot.task is not None:
                slot.task.cancel()
        for slot in self.slots:
            if slot.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await slot.task
        for job in self.queue.drain():
            job.fail(NoWorkerAvailable(f"model {self.name} is shutting down"))
        if workers:  # the slot loops killed them; wait until the OS has them gone
            await asyncio.wait([worker.exited for worker in workers], timeout=30)

    @property
    def ready_workers(self) -> int:
        return sum(slot.state in ("ready", "busy") for slot in self.slots)

    def is_healthy(self) -> bool:
        return self.ready_workers >= len(self.slots)

    # --- requests ------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue a request; raises ``Overloaded`` or ``NoWorkerAvailable``."""
        if not self.slots or all(slot.state in ("failed", "stopped") for slot in self.slots):
            raise NoWorkerAvailable(f"no worker is available for model {self.name}")
        self.queue.put(job)

    # --- the slot loop -------------------------------------------------------------------

    def _spec_for(self, slot: WorkerSlot) -> WorkerSpec:
        gpu = worker_gpu(self.settings.gpu_ids, slot.index)
        worker_id = f"w{slot.index}.{slot.restarts}"
        return WorkerSpec(**{**self.spec.__dict__, "gpu_id": gpu, "worker_id": worker_id})

    async def _run_slot(self, slot: WorkerSlot) -> None:
        backoff = Backoff()
        try:
            while not self._stopping and not slot.retire.is_set():
                try:
                    worker = await WorkerProcess.start(
                        self._spec_for(slot), self.settings.startup_timeout
                    )
                except WorkerStartFailed as exc:
                    self._on_start_failed(slot, str(exc))
                else:
                    backoff.reset()
                    slot.worker, slot.state, slot.ready_since = worker, "ready", time.time()
                    self._first_attempt.set()
                    log.info(
                        "%s v%s worker %d ready (pid %d)",
                        self.name,
                        self.version,
                        slot.index,
                        worker.pid,
                    )
                    await self._serve_with(slot, worker)
                    slot.worker, slot.ready_since = None, None
                    slot.state = "restarting"
                if slot.retire.is_set():
                    break
                slot.restarts += 1
                self.metrics.worker_restarted()
                await asyncio.sleep(backoff.next())
        finally:
            if slot.worker is not None:
                slot.worker.kill()
            slot.state = "stopped"

    def _on_start_failed(self, slot: WorkerSlot, reason: str) -> None:
        slot.state, slot.last_error = "failed", reason
        self._first_attempt.set()
        log.error(
            "%s v%s worker %d failed to start: %s", self.name, self.version, slot.index, reason
        )
        if self.ready_workers == 0:
            # Nobody can serve what is queued: answer now rather than let it wait for a fix.
            for job in self.queue.drain():
                job.fail(NoWorkerAvailable(f"model {self.name} failed to load: {reason}"))

    async def _serve_with(self, slot: WorkerSlot, worker: WorkerProcess) -> None:
        """Feed batches to one worker until it dies or hangs."""
        try:
            in_flight: tuple[PredictBatch, list[Job]] | None = None
            while True:
                if in_flight is None:
                    slot.state = "ready"
                    jobs = await self._next_batch_or_death(worker, slot.retire)
                    if jobs is None:
                        if not slot.retire.is_set():
                            log.warning("%s worker pid %d exited while idle", self.name, worker.pid)
                        return
                    in_flight = self._dispatch(worker, jobs)
                slot.state = "busy"
                batch, jobs = in_flight
                result = await self._collect(worker, batch, jobs)
                if result is None:
                    return
                # Start the worker on its next batch before answering this one: the worker
                # never waits while the frontend writes HTTP responses.
                ready = None if slot.retire.is_set() else self.queue.take_ready()
                in_flight = self._dispatch(worker, ready) if ready else None
                self._deliver(jobs, result)
        finally:
            worker.kill()

    async def _next_batch_or_death(
        self, worker: WorkerProcess, retire: asyncio.Event
    ) -> list[Job] | None:
        """The next batch; None if the worker died or its slot is retired first."""
        take = asyncio.ensure_future(self.queue.take_batch())
        retired = asyncio.ensure_future(retire.wait())
        try:
            await asyncio.wait({take, worker.exited, retired}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
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
        self.queue.put_front(jobs)  # taken in the same instant the worker died or retired
        return None

    def _dispatch(self, worker: WorkerProcess, jobs: list[Job]) -> tuple[PredictBatch, list[Job]]:
        self._batch_ids += 1
        batch = PredictBatch(self._batch_ids, [job.item for job in jobs])
        now = time.monotonic()
        for job in jobs:
            if job.attempts == 0:
                job.queued_seconds = now - job.enqueued_at
            job.attempts += 1
        self.metrics.dispatched((job.queued_seconds for job in jobs), len(jobs))
        worker.send(batch)
        return batch, jobs

    async def _collect(
        self, worker: WorkerProcess, batch: PredictBatch, jobs: list[Job]
    ) -> BatchResult | None:
        """The batch's result; None (its requests answered or requeued) if the worker must go."""
        timeout = self.settings.response_timeout
        try:
            return await worker.result(batch.batch_id, timeout)
        except asyncio.CancelledError:
            for job in jobs:
                job.fail(NoWorkerAvailable(f"model {self.name} is shutting down"))
            raise
        except TimeoutError:
            log.error(
                "%s worker pid %d exceeded responseTimeout %gs; killing it",
                self.name,
                worker.pid,
                timeout,
            )
            for job in jobs:
                job.fail(ResponseTimeout(f"model {self.name} did not answer within {timeout:g}s"))
        except WorkerGone:
            log.error(
                "%s worker pid %d died during a batch of %d", self.name, worker.pid, len(jobs)
            )
            self._retry_or_fail(jobs)
        return None

    def _deliver(self, jobs: list[Job], result: BatchResult) -> None:
        log.debug("%s: batch of %d, handler %.1f ms", self.name, len(jobs), result.handler_ms)
        self.metrics.stages(result.stage_ms)
        for metric in result.metrics:
            self.metrics.handler_metric(
                metric.name, metric.value, metric.unit, metric.kind, metric.dimensions
            )
        by_id = {item.request_id: item for item in result.results}
        for job in jobs:
            item = by_id.get(job.item.request_id)
            if item is None:
                job.fail(HandlerFailed("worker returned no result for this request"))
                continue
            outcome = _to_outcome(item, len(jobs), job.queued_seconds)
            if isinstance(outcome, FerryError):
                job.fail(outcome)
            else:
                job.resolve(outcome)

    def _retry_or_fail(self, jobs: list[Job]) -> None:
        retry = [job for job in jobs if job.attempts < MAX_ATTEMPTS and not job.future.done()]
        for job in jobs:
            if job not in retry:
                job.fail(WorkerDied(f"worker of model {self.name} died while handling the request"))
        if retry:
            self.queue.put_front(retry)
