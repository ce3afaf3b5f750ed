"""A model version's worker slots: start, restart with backoff, give up, scale, recycle, stop.

Each slot owns at most one worker at a time and runs a loop that never dies: whatever
happens to a worker (a crash, a hang, a garbled frame, an error in Ferry itself), the
loop logs it, kills the worker, and starts a replacement after a backoff. A worker that
fails to *load* in a way that cannot change by retrying (the handler raised while
loading, the process cannot be spawned) is retried ``MAX_DETERMINISTIC_FAILURES`` times,
then the slot gives up and keeps the reason for describe and for the 503s it causes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ferry.procinfo import resident_bytes
from ferry.scheduling.dispatcher import Dispatcher, ServeEnd
from ferry.scheduling.lanes import RecycleCheck
from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.handle import (
    StartFailure,
    WorkerFactory,
    WorkerHandle,
    WorkerStartFailed,
)

log = logging.getLogger("ferry.scheduling")

MAX_DETERMINISTIC_FAILURES = 3
"""Load failures in a row (handler errors, spawn errors) before a slot stops retrying."""


class SlotState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    BUSY = "busy"
    RESTARTING = "restarting"
    FAILED = "failed"
    """Its last start failed; it retries after a backoff unless ``gave_up``."""
    STOPPED = "stopped"

    @property
    def serving(self) -> bool:
        return self in (SlotState.READY, SlotState.BUSY)


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


@dataclass(frozen=True)
class RecyclePolicy:
    """Replace a worker between batches once it has answered ``max_requests`` requests or
    its resident memory exceeds ``max_rss_bytes`` (None: no limit)."""

    max_requests: int | None = None
    max_rss_bytes: int | None = None

    def check_for(
        self, pid: int | None, rss: Callable[[int], int] = resident_bytes
    ) -> RecycleCheck | None:
        if self.max_requests is None and self.max_rss_bytes is None:
            return None

        def check(answered: int) -> str | None:
            if self.max_requests is not None and answered >= self.max_requests:
                return f"answered {answered} requests (limit {self.max_requests})"
            if self.max_rss_bytes is not None and pid is not None:
                used = rss(pid)
                if used > self.max_rss_bytes:
                    return f"resident memory {used >> 20} MiB over {self.max_rss_bytes >> 20} MiB"
            return None

        return check


@dataclass
class WorkerSlot:
    index: int
    state: SlotState = SlotState.STARTING
    worker: WorkerHandle | None = None
    restarts: int = 0
    recycles: int = 0
    last_error: str = ""
    """Why its last worker failed to load or died; kept once it is running again."""
    last_failure: StartFailure | None = None
    """How its last start failed; None once a worker came up."""
    load_failures: int = 0
    """Deterministic load failures in a row."""
    gave_up: bool = False
    ready_since: float | None = None
    """Wall-clock time (epoch seconds) its current worker became ready."""
    retire: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set when scaling down or stopping: finish the batch in hand, then stop."""
    first_attempt: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set once its first worker came up or failed to."""
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class PoolEvents:
    """What the pool tells its owner (metrics, queued requests); no-ops by default."""

    def worker_loaded(self, slot: int, seconds: float) -> None:
        pass

    def worker_restarted(self) -> None:
        pass

    def worker_recycled(self, reason: str) -> None:
        pass

    def no_worker_can_serve(self, reason: str) -> None:
        pass

    def last_worker_gone(self) -> None:
        """Its last worker stopped after a scale to 0 (or was retired before it came up)."""


class WorkerPool:
    """Keeps ``len(slots)`` workers of one model version running."""

    def __init__(
        self,
        label: str,
        spec_for: Callable[[WorkerSlot], WorkerSpec],
        start_worker: WorkerFactory,
        dispatcher: Dispatcher,
        startup_timeout: float,
        *,
        recycle: RecyclePolicy | None = None,
        events: PoolEvents | None = None,
        backoff: Callable[[], Backoff] = Backoff,
        serve_out_when_scaled_to_none: bool = True,
    ) -> None:
        self.label = label
        self._serve_out = serve_out_when_scaled_to_none
        """Retired workers serve the queue out when no slot is kept. Off for a model loaded
        on demand: it still admits requests with no slot (they bring a load), so a queue
        it serves out might never end, and an eviction with it."""
        self.slots: list[WorkerSlot] = []
        self._spec_for = spec_for
        self._start_worker = start_worker
        self._dispatcher = dispatcher
        self._startup_timeout = startup_timeout
        self._recycle = recycle or RecyclePolicy()
        self._events = events or PoolEvents()
        self._backoff = backoff
        self._slot_ids = 0
        self._stopping = False
        self._retiring: list[WorkerSlot] = []
        """Retired slots whose worker still finishes its batch: ``stop`` ends them too."""

    # --- state ---------------------------------------------------------------------------

    @property
    def ready_workers(self) -> int:
        return sum(slot.state.serving for slot in self.slots)

    def can_accept(self) -> bool:
        """False when no slot is serving or could come back by itself."""
        return any(not slot.gave_up and slot.state is not SlotState.STOPPED for slot in self.slots)

    def last_error(self) -> str:
        return next((s.last_error for s in self.slots if s.last_error and not s.state.serving), "")

    # --- lifecycle -----------------------------------------------------------------------

    def add_slots(self, count: int) -> list[WorkerSlot]:
        added = []
        for _ in range(count):
            slot = WorkerSlot(self._slot_ids)
            self._slot_ids += 1
            slot.task = asyncio.create_task(
                self._run_slot(slot), name=f"{self.label}-w{slot.index}"
            )
            self.slots.append(slot)
            added.append(slot)
        return added

    async def wait_started(self, slots: list[WorkerSlot] | None = None) -> None:
        """Until every slot (or those given) has tried its first start."""
        for slot in list(self.slots if slots is None else slots):
            await slot.first_attempt.wait()

    def retire(self, slots: list[WorkerSlot]) -> None:
        """Stop these slots once their current batch is answered; one with no worker
        serving (loading, or waiting to retry) holds no request and stops at once, so no
        worker goes on loading a model that may be unregistered next."""
        self._retiring = [s for s in self._retiring if s.task is not None and not s.task.done()]
        for slot in slots:
            slot.retire.set()
            if slot.worker is None and slot.task is not None:
                slot.task.cancel()
            else:
                self._retiring.append(slot)
        self.slots = [slot for slot in self.slots if slot not in slots]

    def revive_given_up(self) -> list[WorkerSlot]:
        """Replace slots that gave up with fresh ones (a user asked for workers again)."""
        dead = [slot for slot in self.slots if slot.gave_up]
        self.retire(dead)
        return self.add_slots(len(dead))

    async def stop(self) -> None:
        """Stop every slot now; requests a worker held are answered by the dispatcher."""
        self._stopping = True
        every = [*self.slots, *self._retiring]
        workers = [slot.worker for slot in every if slot.worker is not None]
        tasks = [slot.task for slot in every if slot.task is not None and not slot.task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if workers:  # the slot loops killed them; wait (bounded) until the OS has them gone
            await asyncio.wait([worker.exited for worker in workers], timeout=30)

    # --- one slot ------------------------------------------------------------------------

    async def _run_slot(self, slot: WorkerSlot) -> None:
        backoff = self._backoff()
        try:
            while not self._stopping and not slot.retire.is_set() and not slot.gave_up:
                try:
                    delay = await self._one_worker(slot, backoff)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug in Ferry must not leave the slot dead
                    log.exception("%s worker slot %d failed; restarting it", self.label, slot.index)
                    delay = backoff.next()
                finally:
                    self._discard_worker(slot)
                if delay is None or slot.gave_up or slot.retire.is_set():
                    continue
                await asyncio.sleep(delay)
        finally:
            self._discard_worker(slot)
            slot.state = SlotState.FAILED if slot.gave_up else SlotState.STOPPED
            slot.first_attempt.set()
            if slot.retire.is_set() and self._no_worker_left(besides=slot):
                self._events.last_worker_gone()

    def _none_kept(self) -> bool:
        """True when every slot is retired (scaled to 0) and the pool is not being stopped
        (``stop`` answers what is queued itself)."""
        return not self.slots and not self._stopping

    def _serves_out(self) -> bool:
        """Whether retired workers serve the queue out before they stop."""
        return self._serve_out and self._none_kept()

    def _no_worker_left(self, besides: WorkerSlot) -> bool:
        """True when no slot will serve any more: none kept, none retiring but ``besides``."""
        retiring = [s for s in self._retiring if s is not besides and not _finished(s)]
        return self._none_kept() and not retiring

    async def _one_worker(self, slot: WorkerSlot, backoff: Backoff) -> float | None:
        """Start one worker and serve with it; returns the delay before the next, or None
        to start the next at once."""
        started = time.monotonic()
        try:
            worker = await self._start_worker(self._spec_for(slot), self._startup_timeout)
        except WorkerStartFailed as failure:
            self._on_start_failed(slot, failure)
            return backoff.next()
        self._on_ready(slot, worker, time.monotonic() - started)
        backoff.reset()

        def on_busy(busy: bool) -> None:
            slot.state = SlotState.BUSY if busy else SlotState.READY

        # A shared process's memory is its models' together: no one model's to recycle for.
        check = self._recycle.check_for(None if worker.info.shared else worker.info.pid)
        end = await self._dispatcher.serve(
            worker, slot.retire, on_busy, check, last_out=self._serves_out
        )
        return self._after_serving(slot, worker.info.pid, end, backoff)

    def _on_ready(self, slot: WorkerSlot, worker: WorkerHandle, seconds: float) -> None:
        self._events.worker_loaded(slot.index, seconds)
        slot.worker, slot.state, slot.ready_since = worker, SlotState.READY, time.time()
        slot.load_failures, slot.last_failure = 0, None
        slot.first_attempt.set()
        info = worker.info
        where = f"{info.device}, shared process" if info.shared else info.device
        log.info("%s worker %d ready (pid %s, %s)", self.label, slot.index, info.pid, where)

    def _after_serving(
        self, slot: WorkerSlot, pid: int | None, end: ServeEnd, backoff: Backoff
    ) -> float | None:
        """The delay before the slot's next worker, by why its worker stopped serving."""
        if end is ServeEnd.RECYCLE:
            slot.recycles += 1
            self._events.worker_recycled("limit")
            return None
        if end in (ServeEnd.FAILED, ServeEnd.EXITED):
            slot.last_error = f"worker pid {pid} {'died' if end is ServeEnd.FAILED else 'exited'}"
            if end is ServeEnd.EXITED:
                log.warning("%s worker pid %s exited while idle", self.label, pid)
            slot.restarts += 1
            slot.state = SlotState.RESTARTING
            self._events.worker_restarted()
            return backoff.next()
        return None

    def _on_start_failed(self, slot: WorkerSlot, failure: WorkerStartFailed) -> None:
        slot.state, slot.last_error = SlotState.FAILED, failure.message
        slot.last_failure = failure.kind
        slot.restarts += 1
        self._events.worker_restarted()
        if failure.kind.deterministic:
            slot.load_failures += 1
            slot.gave_up = slot.load_failures >= MAX_DETERMINISTIC_FAILURES
        slot.first_attempt.set()
        if slot.gave_up:
            log.error(
                "%s worker %d failed to load %d times in a row; giving up: %s",
                self.label,
                slot.index,
                slot.load_failures,
                failure.message,
            )
        else:
            log.error("%s worker %d failed to start: %s", self.label, slot.index, failure.message)
        if self.ready_workers == 0:
            self._events.no_worker_can_serve(failure.message)

    def _discard_worker(self, slot: WorkerSlot) -> None:
        if slot.worker is not None:
            slot.worker.kill()
        slot.worker, slot.ready_since = None, None


def _finished(slot: WorkerSlot) -> bool:
    return slot.task is None or slot.task.done()


def ran_out_of_memory(slots: list[WorkerSlot]) -> bool:
    """Whether every one of ``slots`` failed its last start for want of memory."""
    return bool(slots) and all(s.last_failure is StartFailure.OUT_OF_MEMORY for s in slots)
