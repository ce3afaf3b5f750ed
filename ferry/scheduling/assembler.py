"""The queue of one model version and the batches taken from it; no I/O, clock passed in."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

from ferry.errors import Overloaded
from ferry.scheduling.batch_policy import Decision, WaitingArrivalRate, decide

T = TypeVar("T")


class BatchAssembler(Generic[T]):
    """A bounded FIFO of jobs and the policy that cuts batches from it.

    >>> queue = BatchAssembler[str](batch_size=2, max_delay=0.05, capacity=10)
    >>> queue.put("a", now=0.0)
    >>> queue.poll(now=0.0)   # an idle worker with no evidence of more load: go now
    ['a']
    """

    def __init__(self, batch_size: int, max_delay: float, capacity: int) -> None:
        self.batch_size = batch_size
        self.max_delay = max_delay
        self.capacity = capacity
        self._jobs: deque[tuple[float, T]] = deque()
        self._rate = WaitingArrivalRate()
        self._last_arrival = 0.0

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, job: T, now: float) -> None:
        """Queue a job; raises ``Overloaded`` when the queue is full."""
        if len(self._jobs) >= self.capacity:
            raise Overloaded(f"queue full ({self.capacity} requests waiting)")
        self._rate.advance(now, queue_was_waiting=bool(self._jobs))
        self._rate.record_arrival(joined_waiting_queue=bool(self._jobs))
        self._jobs.append((now, job))
        self._last_arrival = now

    def put_front(self, jobs: Iterable[T], now: float) -> None:
        """Return jobs to the head of the queue (a retry); capacity is not re-checked."""
        self._rate.advance(now, queue_was_waiting=bool(self._jobs))
        for job in reversed(list(jobs)):
            self._jobs.appendleft((now, job))

    def decision(self, now: float) -> Decision:
        if not self._jobs:
            return Decision(dispatch=False)
        return decide(
            now=now,
            queued=len(self._jobs),
            oldest_arrival=self._jobs[0][0],
            last_arrival=self._last_arrival,
            batch_size=self.batch_size,
            max_delay=self.max_delay,
            arrival_rate=self._rate.per_second(),
        )

    def take(self, now: float) -> list[T]:
        """Remove and return up to ``batch_size`` jobs, oldest first."""
        self._rate.advance(now, queue_was_waiting=bool(self._jobs))
        count = min(self.batch_size, len(self._jobs))
        return [self._jobs.popleft()[1] for _ in range(count)]

    def poll(self, now: float) -> list[T] | None:
        """The next batch if the policy says go now, else None."""
        return self.take(now) if self.decision(now).dispatch else None

    def drain(self, now: float) -> list[T]:
        """Remove every job (to fail them all)."""
        self._rate.advance(now, queue_was_waiting=bool(self._jobs))
        jobs = [job for _, job in self._jobs]
        self._jobs.clear()
        return jobs
