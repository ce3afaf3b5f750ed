"""What one worker holds while the dispatcher feeds it (``ferry.scheduling.dispatcher``):
where its batches come from, the batches sent to it and every request among them, and
whether it is due to be replaced. Pure bookkeeping: nothing here awaits or sends."""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from ferry.scheduling.jobs import Job
from ferry.scheduling.observers import BatchWatch
from ferry.wire.messages import PredictBatch

RecycleCheck = Callable[[int], str | None]
"""Given the requests a worker has answered, the reason to replace it now, or None."""


class BatchSource(Protocol):
    """Where a worker's batches come from: the model's queue (``BatchQueue``), or, for a
    stateful model, the worker's own sequences (``SequenceLane``)."""

    @property
    def batch_size(self) -> int: ...

    def __len__(self) -> int: ...

    def take_ready(self) -> list[Job] | None: ...

    async def take_batch(self) -> list[Job]: ...

    def put_front(self, jobs: Iterable[Job]) -> None: ...


class InFlight:
    """The requests handed to one worker and not yet answered.

    Kept by identity, not by request id: a client may choose its request id
    (``x-request-id``), and a request abandoned on a worker may share it with a newer one;
    each batch's results are matched against that batch's own requests."""

    def __init__(self) -> None:
        self._jobs: dict[int, Job] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self._jobs[id(job)] = job

    def holds(self, job: Job) -> bool:
        return id(job) in self._jobs

    def discard(self, job: Job) -> bool:
        """Forget ``job``; False if it was not held."""
        return self._jobs.pop(id(job), None) is not None

    def pop_all(self) -> list[Job]:
        jobs = list(self._jobs.values())
        self._jobs.clear()
        return jobs


@dataclass
class Exchange:
    """A batch sent to a worker and the moment its answer is due (counted from when the
    worker can start on it: when it was sent, or when the batch ahead of it came back)."""

    batch: PredictBatch
    jobs: list[Job]
    deadline: float
    started_at: float
    """When the worker could start on it (TorchServe's WorkerThreadTime counts from here)."""
    cancelled: list[Job] = field(default_factory=list)
    """Its requests whose client went away while the worker streamed to them, told to it."""
    abandoned_at: float | None = None
    """When the last of its requests lost its client: the worker has ``cancel_grace``
    from then to stop."""
    watch: BatchWatch | None = None
    """What an observer keeps of it, when one watches any of its requests."""

    def abandoned(self) -> bool:
        return self.abandoned_at is not None


@dataclass
class Lane:
    """What one worker holds: the batches sent to it, oldest (the one it works on) first,
    and every request among them by id; and whether it is due to be replaced."""

    source: BatchSource
    """Where its batches come from."""
    pending: deque[Exchange] = field(default_factory=deque)
    held: InFlight = field(default_factory=InFlight)
    sizes_run: set[int] = field(default_factory=set)
    """Batch sizes the worker has answered (its first of a size pays one-off costs)."""
    recycle: RecycleCheck | None = None
    """Asked, after each batch, whether the worker is due to be replaced."""
    answered: int = 0
    """Requests the worker has answered."""
    recycling: str | None = None
    """Why the worker is replaced once the batches it holds are answered, if it is."""
    last_out: Callable[[], bool] = field(default=lambda: False)
    """Asked once the worker is retired: True while no other worker will serve its model
    (scaled to 0), so it answers what is still queued before it stops."""

    def note_answered(self, exchange: Exchange) -> None:
        """Count the batch's requests as answered, and ask ``recycle`` (until it gives a
        reason) whether the worker is now due to be replaced."""
        self.answered += len(exchange.jobs)
        if self.recycle is not None and not self.recycling:
            self.recycling = self.recycle(self.answered)

    def note_size(self, exchange: Exchange) -> bool:
        """Note the batch's size as run; True if the worker had run none of that size."""
        size = len(exchange.jobs)
        first = size not in self.sizes_run
        self.sizes_run.add(size)
        return first

    def started_count(self) -> int:
        """How many requests of the batch the worker was working on it still holds."""
        head = self.pending[0].jobs if self.pending else []
        return sum(1 for job in head if self.held.holds(job))

    def started_and_waiting(self) -> tuple[list[Job], list[Job]]:
        """The requests of the batch the worker was working on, and all others it held
        (queued behind it in the worker, or being sent): those never started."""
        head = self.pending[0].jobs if self.pending else []
        jobs = self.held.pop_all()
        started = [job for job in jobs if any(job is h for h in head)]
        return started, [job for job in jobs if not any(job is h for h in head)]


def give_back(takes: dict[asyncio.Future[list[Job]], BatchSource], keep: object) -> None:
    """Cancel the takes other than ``keep``; jobs any of them took go back to the front
    of the queue they came from (cancelling take_batch itself takes nothing)."""
    for take, queue in takes.items():
        if take is keep:
            continue
        if take.done():
            if not take.cancelled():
                queue.put_front(take.result())
            continue
        take.cancel()
        # A take may still finish with a batch (a cancel the coroutine did not see):
        # what it took goes back rather than be lost with it.
        take.add_done_callback(functools.partial(_put_back_late, queue))


def _put_back_late(queue: BatchSource, take: asyncio.Future[list[Job]]) -> None:
    if not take.cancelled() and take.exception() is None and take.result():
        queue.put_front(take.result())


__all__ = ["BatchSource", "Exchange", "InFlight", "Lane", "RecycleCheck", "give_back"]
