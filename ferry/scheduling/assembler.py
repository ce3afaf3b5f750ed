"""The queue of one model version and the batches taken from it; no I/O, clock passed in."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from ferry.errors import Overloaded
from ferry.scheduling.batch_policy import (
    BatchPolicy,
    CostModel,
    Decision,
    QueueState,
    make_policy,
)

T = TypeVar("T")


class BatchAssembler(Generic[T]):
    """A bounded FIFO of jobs and the policy that cuts batches from it.

    >>> queue = BatchAssembler[str](batch_size=2, max_delay=0.05, capacity=10)
    >>> queue.put("a", now=0.0)
    >>> queue.poll(now=0.0)   # an idle worker with no evidence of more load: go now
    (['a'], 'idle_worker')
    """

    def __init__(
        self, batch_size: int, max_delay: float, capacity: int, policy: BatchPolicy | None = None
    ) -> None:
        self.batch_size = batch_size
        self.max_delay = max_delay
        self.capacity = capacity
        self.policy = policy or make_policy("adaptive")
        self.costs = CostModel()
        """Batch costs seen, whatever the policy: what shedding by deadline consults."""
        self._jobs: deque[tuple[float, T]] = deque()

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, job: T, now: float) -> None:
        """Queue a job; raises ``Overloaded`` when the queue is full."""
        if len(self._jobs) >= self.capacity:
            raise Overloaded(f"queue full ({self.capacity} requests waiting)")
        self.policy.arrived(now)
        self._jobs.append((now, job))

    def put_front(self, jobs: Iterable[T], now: float) -> None:
        """Return jobs to the head of the queue (a retry); capacity is not re-checked."""
        for job in reversed(list(jobs)):
            self._jobs.appendleft((now, job))

    def decision(self, now: float, worker_free_since: float | None = None) -> Decision:
        """The policy's decision for a worker free since ``worker_free_since`` (now if
        None: a worker that just finished a batch)."""
        if not self._jobs:
            return Decision(dispatch=False)
        state = QueueState(
            now=now,
            queued=len(self._jobs),
            oldest_arrival=self._jobs[0][0],
            worker_free_since=now if worker_free_since is None else worker_free_since,
            batch_size=self.batch_size,
            max_delay=self.max_delay,
            costs=self.costs,
        )
        return self.policy.decide(state)

    def take(self, now: float) -> list[T]:
        """Remove and return up to ``batch_size`` jobs, oldest first."""
        count = min(self.batch_size, len(self._jobs))
        return [self._jobs.popleft()[1] for _ in range(count)]

    def poll(self, now: float) -> tuple[list[T], str] | None:
        """The next batch and why it goes, if the policy says go now, else None."""
        decision = self.decision(now)
        return (self.take(now), decision.reason) if decision.dispatch else None

    def batch_timed(self, size: int, seconds: float) -> None:
        """The time a batch of ``size`` occupied a worker: the policy's cost evidence."""
        self.costs.observe(size, seconds)

    def describe(self, now: float) -> dict[str, Any]:
        """The policy's name and state, and the batch costs learned so far."""
        learned = {str(size): round(s * 1000, 3) for size, s in sorted(self.costs.seconds.items())}
        return {**self.policy.describe(now), "learnedCostMs": learned}

    def drain(self, now: float) -> list[T]:
        """Remove every job (to fail them all)."""
        jobs = [job for _, job in self._jobs]
        self._jobs.clear()
        return jobs
