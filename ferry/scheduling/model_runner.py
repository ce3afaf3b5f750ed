"""One model version: its queue, the dispatcher that feeds workers from it, and the pool
of worker slots (``pool.py``) that keeps those workers running."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ferry.batching.registry import BATCH_POLICIES, PolicyKind
from ferry.capacity.budgets import HOST
from ferry.capacity.placement import worker_gpu
from ferry.errors import ModelLoadFailed, NoWorkerAvailable, Overloaded
from ferry.handlers.contract.context import SEQUENCE_ID_HEADER
from ferry.metrics.definitions import FerryMetrics, ModelMetrics
from ferry.scheduling.batch_queue import BatchQueue
from ferry.scheduling.dispatcher import Dispatcher
from ferry.scheduling.jobs import LATE_PRIORITY, Job, OnPredictionPart
from ferry.scheduling.observers import Observer, refused, watch_request
from ferry.scheduling.pool import (
    Backoff,
    PoolEvents,
    RecyclePolicy,
    SlotState,
    WorkerPool,
    WorkerSlot,
    ran_out_of_memory,
)
from ferry.scheduling.sequences import (
    SequenceBook,
    SequenceSettings,
    asks_to_end,
    sequence_of,
)
from ferry.wire.messages import InputPart, RequestItem
from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.handle import WorkerFactory

_HOLDING = (SlotState.BUSY, SlotState.STARTING, SlotState.RESTARTING)
"""Slot states in which the model is in use (a restarting slot's requests are retried)."""


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
    recycle: RecyclePolicy = field(default_factory=RecyclePolicy)
    batch_policy: str = "adaptive"
    """``batchPolicy``: a policy of ``ferry.batching.registry``."""
    batch_policy_options: Mapping[str, Any] = field(default_factory=dict)
    """The policy's options by model-config.yaml key (``latencyObjectiveMs``)."""
    client_timeout_ms: float | None = None
    """``clientTimeoutInMills``: the deadline of requests that bring none."""
    deadline_action: str = "reject"
    """``deadlineAction``: what happens to a request that misses its deadline while
    queued: ``reject`` (answered ``DeadlineExceeded``) or ``delay`` (kept, last in line)."""
    stream_timeout: float | None = None
    """Seconds a streamed answer may take in all (``stream_timeout``)."""
    cancel_grace: float = 5.0
    """Seconds a worker has to stop a stream nobody reads any more (``cancel_grace``)."""
    sequences: SequenceSettings | None = None
    """A stateful model's limits (``sequenceBatching``); None for any other model."""
    process_group: str = ""
    """The process group whose worker processes it shares; "" for processes of its own."""
    load_on_demand: bool = False
    """No workers until a request comes (``ferry.scheduling.residency``)."""


def _policy_kind(name: str, *, stateful: bool) -> PolicyKind:
    """The policy called ``name``; ``ValueError`` if there is none, or if a stateful
    model asks for one that says it cannot batch sequences."""
    kind = BATCH_POLICIES.kind(name)
    if stateful and not kind.serves_sequences:
        raise ValueError(f"batch policy {name!r} cannot batch a stateful model's sequences")
    return kind


class _RunnerEvents(PoolEvents):
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def worker_loaded(self, slot: int, seconds: float) -> None:
        runner = self.runner
        runner.metrics.worker_loaded(f"{runner.name}/{runner.version}/w{slot}", seconds * 1000)

    def worker_restarted(self) -> None:
        self.runner.metrics.worker_restarted()

    def worker_recycled(self, reason: str) -> None:
        self.runner.metrics.worker_recycled()

    def no_worker_can_serve(self, reason: str) -> None:
        # Nobody can serve what is queued: answer now rather than let it wait for a fix.
        runner = self.runner
        error = NoWorkerAvailable(f"model {runner.name} failed to load: {reason}")
        runner.dispatcher.fail_queued(error)

    def last_worker_gone(self) -> None:
        # What is still queued was admitted before the scale to 0: a model loaded on demand
        # loads again for it; any other is told no worker will come.
        runner = self.runner
        if not runner.waiting:
            return
        if runner.settings.load_on_demand:
            runner._wanted()
            return
        error = NoWorkerAvailable(
            f"model {runner.name} version {runner.version} was scaled to 0 workers "
            "before this request was served"
        )
        runner.dispatcher.fail_queued(error)


class ModelRunner:
    """Serves one model version with ``settings.workers`` workers from ``start_worker``."""

    def __init__(
        self,
        name: str,
        version: str,
        spec: WorkerSpec,
        settings: RunnerSettings,
        start_worker: WorkerFactory,
        metrics: ModelMetrics | None = None,
        *,
        backoff: Callable[[], Backoff] = Backoff,
        observer: Observer | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.spec = spec
        self.settings = settings
        self.metrics = metrics or FerryMetrics(enabled=False).for_model(name, version)
        policy = _policy_kind(settings.batch_policy, stateful=settings.sequences is not None)
        self.queue: BatchQueue[Job] = BatchQueue(
            settings.batch_size,
            settings.max_batch_delay,
            settings.queue_capacity,
            policy=policy.make(settings.batch_policy_options),
            on_dispatch=self.metrics.batch_released,
            priority_of=lambda job: job.priority,
        )
        self.sequences = (
            None
            if settings.sequences is None
            else SequenceBook(
                settings.sequences,
                settings.batch_size,
                settings.max_batch_delay,
                wait_for_more=policy.sequences_wait,
            )
        )
        self.dispatcher = Dispatcher(
            name,
            self.queue,
            self.metrics,
            settings.response_timeout,
            delay_late=settings.deadline_action == "delay",
            stream_timeout=settings.stream_timeout,
            cancel_grace=settings.cancel_grace,
            sequences=self.sequences,
            observer=observer,
        )
        self.observer = observer
        """What watches its requests and batches (``ferry.scheduling.observers``), if anything."""
        self.pool = WorkerPool(
            f"{name} v{version}",
            self._spec_for,
            start_worker,
            self.dispatcher,
            settings.startup_timeout,
            recycle=settings.recycle,
            events=_RunnerEvents(self),
            backoff=backoff,
            serve_out_when_scaled_to_none=not settings.load_on_demand,
        )
        self.max_workers = max(settings.max_workers, settings.workers)
        self.label = f"{name} v{version}"
        self.stopped = False
        """Set by ``stop``: it takes no request any more."""
        self.demand: Callable[[str], None] | None = None
        """Told of every request by its label (``Residency.wanted``), when residency
        manages the model."""
        self.load_refused: Callable[[str], str | None] | None = None
        """Why a load on demand is not tried now (``Residency.refusal``: the last load
        failed a moment ago), or None."""

    def set_batch_policy(self, name: str, options: Mapping[str, Any]) -> None:
        """Batch with policy ``name`` and its ``options`` from now on (``ValueError`` for
        an unknown one, or one a stateful model cannot use)."""
        policy = _policy_kind(name, stateful=self.sequences is not None)
        self.queue.set_policy(policy.make(options))
        if self.sequences is not None:
            self.sequences.wait_for_more = policy.sequences_wait
        self.settings = dataclasses.replace(
            self.settings, batch_policy=name, batch_policy_options=dict(options)
        )

    def set_torch_threads(self, threads: int) -> None:
        """The torch thread count of the workers started from now on."""
        self.spec = dataclasses.replace(self.spec, torch_threads=threads)
        self.settings = dataclasses.replace(self.settings, torch_threads=threads)

    @property
    def slots(self) -> list[WorkerSlot]:
        return self.pool.slots

    @property
    def ready_workers(self) -> int:
        return self.pool.ready_workers

    def is_healthy(self) -> bool:
        """Every configured worker is serving."""
        return self.ready_workers >= len(self.slots)

    def is_ready(self) -> bool:
        """At least one worker can take a request, or the model loads on its first
        (per-model readiness)."""
        return self.ready_workers > 0 or self._loads_on_demand()

    def _loads_on_demand(self) -> bool:
        """It has no workers, and a request will bring them (on demand)."""
        return self.settings.load_on_demand and not self.slots

    def last_error(self) -> str:
        """Why a worker last failed to load or died, while the model is short of workers."""
        return self.pool.last_error()

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start its workers; a model loaded on demand starts none."""
        if not self.settings.load_on_demand:
            self.pool.add_slots(self.settings.workers)

    # --- residency (``ferry.scheduling.residency.OnDemandModel``) ------------------------

    def resident(self) -> bool:
        return bool(self.slots)

    def busy(self) -> bool:
        """Requests are queued (retries and describe calls included), running, or held
        by a worker that is restarting, or a stateful sequence is open: not to be evicted."""
        if self.waiting > 0 or len(self.dispatcher.suspects) > 0:
            return True
        if self.sequences is not None and self.sequences.open_sequences:
            return True
        return any(slot.state in _HOLDING for slot in self.slots)

    def footprint(self) -> dict[str, int]:
        """What its workers measured at their load: host memory, and each GPU's. Weights
        its workers map from one file (``ferry.handlers.builtin.shared_weights``) count
        once, however many map them; so does a weights keeper's copy, on its GPU."""
        total: dict[str, int] = {}
        shared: dict[tuple[str, str], int] = {}
        for slot in self.slots:
            if slot.worker is None:
                continue
            info = slot.worker.info
            total[HOST] = total.get(HOST, 0) + info.footprint_bytes
            if info.shared_weights_key:
                place = info.device if info.shared_weights_on_gpu else HOST
                shared[(place, info.shared_weights_key)] = info.shared_weights_bytes
            if info.gpu_bytes:
                total[info.device] = total.get(info.device, 0) + info.gpu_bytes
        for (place, _), size in shared.items():
            total[place] = total.get(place, 0) + size
        return total

    async def load(self) -> None:
        """Its workers up, at least one (a model registered with none, as TorchServe's
        registration defaults to, still loads one on demand); ``ModelLoadFailed`` when
        none could start, after answering what waits for it."""
        started = time.monotonic()
        workers = max(1, self.settings.workers)
        try:
            await self.scale(workers, max(self.max_workers, workers), wait=True)
        except ModelLoadFailed as error:
            self.dispatcher.fail_queued(NoWorkerAvailable(str(error)))
            raise
        self.metrics.loaded_on_demand(time.monotonic() - started)

    async def evict(self) -> None:
        """Its workers stopped, once the batches they hold are answered."""
        await self.scale(0, self.max_workers, wait=True)
        self.metrics.evicted()

    async def wait_started(self, slots: list[WorkerSlot] | None = None) -> None:
        """Until every slot (or those given) has tried its first start."""
        await self.pool.wait_started(slots)

    async def scale(self, workers: int, max_workers: int, *, wait: bool) -> None:
        """Run ``workers`` workers. Retired workers finish the batch they hold first, so
        scaling down under load fails no request. Slots that gave up are started afresh.
        With ``wait``, raises ``ModelLoadFailed`` (and removes them again) when new
        workers fail to come up."""
        self.max_workers = max(max_workers, workers)
        revived = self.pool.revive_given_up()
        added = self.pool.add_slots(max(0, workers - len(self.slots)))
        retired = self.slots[workers:]
        self.pool.retire(retired)
        if not wait:
            return
        new = [slot for slot in revived + added if slot not in retired]
        # Workers an earlier asynchronous scale started are still loading: "scaled" means
        # they are up too, so wait for them as well (their failures are their own retries').
        loading = [s for s in self.slots if s not in new and not s.first_attempt.is_set()]
        await self.pool.wait_started(new + loading)
        failed = [slot for slot in new if not slot.state.serving]
        if failed:
            self.pool.retire([slot for slot in failed if slot in added])  # scale-up undone
            reason = failed[0].last_error or "worker did not start"
            raise ModelLoadFailed(
                f"{len(failed)} of {len(new)} new workers of model {self.name} failed to start: "
                f"{reason}",
                out_of_memory=ran_out_of_memory(failed),
            )
        tasks = [slot.task for slot in retired if slot.task is not None]
        # Slots retired while loading were cancelled: their CancelledError is not ours.
        await asyncio.gather(*tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Stop every worker and answer whatever is still queued."""
        self.stopped = True
        await self.pool.stop()
        self.dispatcher.fail_queued(NoWorkerAvailable(f"model {self.name} is shutting down"))

    # --- requests ------------------------------------------------------------------------

    def check_admission(self) -> None:
        """Raise now what ``submit`` would raise for a request arriving now (``Overloaded``
        or ``NoWorkerAvailable``): transports call it before reading a body, so a flood of
        requests the model cannot take costs as little as possible."""
        if self.stopped:  # unregistered (or the server stops) since the request was admitted
            raise NoWorkerAvailable(f"model {self.name} version {self.version} is no longer served")
        if self._loads_on_demand() and self.load_refused is not None:
            refusal = self.load_refused(self.label)
            if refusal is not None:
                raise NoWorkerAvailable(f"model {self.name} is not loaded: {refusal}")
        if not self.pool.can_accept() and not self._loads_on_demand():
            reason = self.last_error()
            detail = f": last load error: {reason}" if reason else ""
            raise NoWorkerAvailable(f"no worker is available for model {self.name}{detail}")
        if self.sequences is None and len(self.queue) >= self.queue.capacity:
            raise Overloaded(f"queue full ({self.queue.capacity} requests waiting)")

    def submit(self, job: Job) -> None:
        """Queue a request; raises ``Overloaded`` or ``NoWorkerAvailable`` (and, for a
        stateful model, ``SequenceEnded``)."""
        self.check_admission()
        if self.sequences is None:
            self.queue.put(job)
        else:
            sequence_id = job.item.headers[SEQUENCE_ID_HEADER]
            self.sequences.add(job, sequence_id, last=asks_to_end(job.item.headers))
        self._wanted()

    def _wanted(self) -> None:
        if self.demand is not None:
            self.demand(self.label)

    @property
    def waiting(self) -> int:
        """Requests queued, in the model's queue or its sequences."""
        return len(self.queue) + (len(self.sequences) if self.sequences is not None else 0)

    def deadline_passed(self, job: Job) -> None:
        """``job``'s deadline passed: answered ``DeadlineExceeded`` now (``reject``), or
        kept behind every request that can still be on time (``delay``); either way only
        if no worker has it yet."""
        if self.settings.deadline_action == "delay":
            if self.queue.demote(job, LATE_PRIORITY):
                job.priority, job.deadline = LATE_PRIORITY, None
                self.metrics.delayed(1)
        else:
            job.expire()

    def enqueue(
        self,
        request_id: str,
        headers: dict[str, str],
        parts: list[InputPart],
        on_part: OnPredictionPart | None = None,
        priority: int = 0,
        budget: float | None = None,
        *,
        alone: bool = False,
        envelope: str = "",
        watched: bool = True,
    ) -> Job:
        """Queue a request as a job, whose ``future`` gets its answer; raises
        ``Overloaded`` or ``NoWorkerAvailable``. ``budget``: the seconds it may take from
        now, after which ``deadline_passed``; ``alone``: in a batch of its own, ahead of
        the others (``submit_alone``); ``envelope``: the request envelope its protocol is
        read with (``RequestItem.envelope``); ``watched``: shown to the observer (not
        Ferry's own requests, such as describe's)."""
        if self.sequences is not None and not alone:
            _, headers = sequence_of(headers)
        item = RequestItem(request_id, headers, parts, envelope)
        job = Job(item, asyncio.get_running_loop().create_future(), on_part, priority=priority)
        if self.observer is not None and watched:
            watch_request(self.observer, self.name, self.version, job)
        self._queue(job, budget, alone=alone)
        return job

    def _queue(self, job: Job, budget: float | None, *, alone: bool) -> None:
        """Queue ``job`` with its deadline's timer; refused, the timer is cancelled and
        its observer told."""
        expiry = self._deadline_timer(job, budget)
        try:
            if alone:
                self.submit_alone(job)
            else:
                self.submit(job)
        except BaseException as error:
            if expiry is not None:
                expiry.cancel()
            refused(job, error)
            raise
        if expiry is not None:
            job.future.add_done_callback(lambda _: expiry.cancel())

    def _deadline_timer(self, job: Job, budget: float | None) -> asyncio.TimerHandle | None:
        """With a ``budget``, the job's deadline (the queue batches by it) and the timer
        that calls ``deadline_passed`` at it (armed now, not at dispatch)."""
        if budget is None:
            return None
        job.deadline = job.enqueued_at + budget
        return asyncio.get_running_loop().call_later(budget, self.deadline_passed, job)

    def client_budget(self, asked: float | None) -> float | None:
        """A client request's budget in seconds: what it asked for, else the model's
        ``clientTimeoutInMills``, else none."""
        if asked is None and self.settings.client_timeout_ms is not None:
            return self.settings.client_timeout_ms / 1000
        return asked

    def submit_alone(self, job: Job) -> None:
        """Queue a request that must be alone in its batch, ahead of the others (a
        describe request: the handler looks at the batch's first request only)."""
        self.check_admission()
        self.dispatcher.put_alone(job)
        self._wanted()

    def _spec_for(self, slot: WorkerSlot) -> WorkerSpec:
        gpu = worker_gpu(self.settings.gpu_ids, slot.index)
        worker_id = f"w{slot.index}.{slot.restarts + slot.recycles}"
        return dataclasses.replace(self.spec, gpu_id=gpu, worker_id=worker_id)
