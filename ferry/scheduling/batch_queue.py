"""The asyncio face of ``BatchAssembler``: workers await their next batch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from ferry.batching.policies import BatchPolicy, CostModel
from ferry.scheduling.assembler import BatchAssembler
from ferry.scheduling.waiting import wake_or_time_out

T = TypeVar("T")


class BatchQueue(Generic[T]):
    def __init__(
        self,
        batch_size: int,
        max_delay: float,
        capacity: int,
        clock: Callable[[], float] = time.monotonic,
        policy: BatchPolicy | None = None,
        on_dispatch: Callable[[str, int], None] | None = None,
        priority_of: Callable[[T], int] = lambda job: 0,
    ) -> None:
        self._assembler = BatchAssembler[T](batch_size, max_delay, capacity, policy)
        self._priority_of = priority_of
        self._clock = clock
        self._waiters: list[asyncio.Future[None]] = []
        self._on_dispatch = on_dispatch
        """Told each batch's reason and size (the metrics' ``reason`` label)."""

    def __len__(self) -> int:
        return len(self._assembler)

    @property
    def capacity(self) -> int:
        return self._assembler.capacity

    @property
    def batch_size(self) -> int:
        return self._assembler.batch_size

    @property
    def costs(self) -> CostModel:
        """The batch costs learned so far (read them; ``batch_timed`` teaches them)."""
        return self._assembler.costs

    def _wake_all(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def put(self, job: T) -> None:
        self._assembler.put(job, self._clock(), self._priority_of(job))
        self._wake_all()

    def put_front(self, jobs: Iterable[T]) -> None:
        now = self._clock()
        by_priority: dict[int, list[T]] = {}
        for job in jobs:
            by_priority.setdefault(self._priority_of(job), []).append(job)
        for priority, level in by_priority.items():
            self._assembler.put_front(level, now, priority)
        self._wake_all()

    def demote(self, job: T, priority: int) -> bool:
        """Move a queued ``job`` behind every other, to ``priority``; False when it is no
        longer queued (a worker has it, or it was answered)."""
        return self._assembler.demote(job, priority)

    def drain(self) -> list[T]:
        return self._assembler.drain(self._clock())

    @property
    def policy(self) -> BatchPolicy:
        return self._assembler.policy

    def set_policy(self, policy: BatchPolicy) -> None:
        """Switch policy; queued requests stay, and waiting workers decide again at once."""
        self._assembler.policy = policy
        self._wake_all()

    def batch_timed(self, size: int, seconds: float, *, workers_first: bool = False) -> None:
        self._assembler.batch_timed(size, seconds, workers_first=workers_first)

    def expected_cost(self, size: int) -> float:
        """Seconds a batch of ``size`` is expected to take (0 before any was timed)."""
        return self._assembler.costs.cost(size) or 0.0

    def describe(self) -> dict[str, Any]:
        return self._assembler.describe(self._clock())

    def _released(self, jobs: list[T], reason: str) -> list[T]:
        if self._on_dispatch is not None and jobs:
            self._on_dispatch(reason, len(jobs))
        return jobs

    def take_ready(self) -> list[T] | None:
        """The next batch if the policy releases one right now, without waiting."""
        released = self._assembler.poll(self._clock())
        return None if released is None else self._released(*released)

    async def take_batch(self) -> list[T]:
        """Wait until the policy releases a batch. Cancelling takes nothing from the queue."""
        free_since = self._clock()
        while True:
            now = self._clock()
            decision = self._assembler.decision(now, free_since)
            if decision.dispatch:
                return self._released(self._assembler.take(now), decision.reason)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await wake_or_time_out(waiter, decision.wake_at, now)
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
