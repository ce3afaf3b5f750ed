"""The asyncio face of ``BatchAssembler``: workers await their next batch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from ferry.scheduling.assembler import BatchAssembler

T = TypeVar("T")


class BatchQueue(Generic[T]):
    def __init__(
        self,
        batch_size: int,
        max_delay: float,
        capacity: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._assembler = BatchAssembler[T](batch_size, max_delay, capacity)
        self._clock = clock
        self._waiters: list[asyncio.Future[None]] = []

    def __len__(self) -> int:
        return len(self._assembler)

    @property
    def capacity(self) -> int:
        return self._assembler.capacity

    @property
    def batch_size(self) -> int:
        return self._assembler.batch_size

    def _wake_all(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def put(self, job: T) -> None:
        self._assembler.put(job, self._clock())
        self._wake_all()

    def put_front(self, jobs: Iterable[T]) -> None:
        self._assembler.put_front(jobs, self._clock())
        self._wake_all()

    def drain(self) -> list[T]:
        return self._assembler.drain(self._clock())

    def take_ready(self) -> list[T] | None:
        """The next batch if the policy releases one right now, without waiting."""
        return self._assembler.poll(self._clock())

    async def take_batch(self) -> list[T]:
        """Wait until the policy releases a batch. Cancelling takes nothing from the queue."""
        while True:
            now = self._clock()
            decision = self._assembler.decision(now)
            if decision.dispatch:
                return self._assembler.take(now)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            timeout = None if decision.wake_at is None else max(0.0, decision.wake_at - now)
            try:
                await asyncio.wait_for(waiter, timeout)
            except TimeoutError:
                pass
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
