"""The queue of one model version and the batches taken from it; no I/O, clock passed in."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from ferry.batching.policies import (
    AdaptivePolicy,
    BatchPolicy,
    CostModel,
    Decision,
    QueueState,
)
from ferry.errors import Overloaded

T = TypeVar("T")


class BatchAssembler(Generic[T]):
    """A bounded queue of jobs and the policy that cuts batches from it. Jobs of a higher
    priority go into batches first; within a priority, oldest first. The policy's delay
    bound counts from the oldest job of any priority, so none waits past it for long.

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
        self.policy = policy or AdaptivePolicy()
        self.costs = CostModel()
        """Batch costs seen, whatever the policy: what shedding by deadline consults."""
        self._levels: dict[int, deque[tuple[float, T]]] = {}
        """Queued jobs by priority, each level oldest first; empty levels are removed."""
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def put(self, job: T, now: float, priority: int = 0) -> None:
        """Queue a job; raises ``Overloaded`` when the queue is full (whatever the
        priority: a full queue is a signal to the client, not a reason to drop another)."""
        if self._count >= self.capacity:
            raise Overloaded(f"queue full ({self.capacity} requests waiting)")
        self.policy.arrived(now)
        self._levels.setdefault(priority, deque()).append((now, job))
        self._count += 1

    def put_front(self, jobs: Iterable[T], now: float, priority: int = 0) -> None:
        """Return jobs to the head of their priority (a retry); capacity is not re-checked."""
        level = self._levels.setdefault(priority, deque())
        for job in reversed(list(jobs)):
            level.appendleft((now, job))
            self._count += 1

    def demote(self, job: T, priority: int) -> bool:
        """Move a queued ``job`` to the back of ``priority`` (a request that missed its
        deadline, kept last in line); False when it is not queued."""
        for level_priority, level in self._levels.items():
            index = next((i for i, (_, queued) in enumerate(level) if queued is job), None)
            if index is None:
                continue
            arrival, _ = level[index]
            del level[index]
            if not level:
                del self._levels[level_priority]
            # Its arrival stays: the delay bound still counts from it.
            self._levels.setdefault(priority, deque()).append((arrival, job))
            return True
        return False

    def _oldest_arrival(self) -> float:
        return min(level[0][0] for level in self._levels.values())

    def decision(self, now: float, worker_free_since: float | None = None) -> Decision:
        """The policy's decision for a worker free since ``worker_free_since`` (now if
        None: a worker that just finished a batch)."""
        if not self._count:
            return Decision(dispatch=False)
        state = QueueState(
            now=now,
            queued=self._count,
            oldest_arrival=self._oldest_arrival(),
            worker_free_since=now if worker_free_since is None else worker_free_since,
            batch_size=self.batch_size,
            max_delay=self.max_delay,
            costs=self.costs,
        )
        return self.policy.decide(state)

    def take(self, now: float) -> list[T]:
        """Remove and return up to ``batch_size`` jobs: highest priority first, then
        oldest first."""
        batch: list[T] = []
        for priority in sorted(self._levels, reverse=True):
            level = self._levels[priority]
            while level and len(batch) < self.batch_size:
                batch.append(level.popleft()[1])
            if not level:
                del self._levels[priority]
            if len(batch) == self.batch_size:
                break
        self._count -= len(batch)
        return batch

    def poll(self, now: float) -> tuple[list[T], str] | None:
        """The next batch and why it goes, if the policy says go now, else None."""
        decision = self.decision(now)
        return (self.take(now), decision.reason) if decision.dispatch else None

    def batch_timed(self, size: int, seconds: float, *, workers_first: bool = False) -> None:
        """The time a batch of ``size`` occupied a worker (``workers_first``: the worker's
        first of that size): the policy's cost evidence."""
        self.costs.observe(size, seconds, workers_first=workers_first)

    def describe(self, now: float) -> dict[str, Any]:
        """The policy's name and state, and the batch costs learned so far."""
        learned = {str(size): round(s * 1000, 3) for size, s in sorted(self.costs.seconds.items())}
        return {**self.policy.describe(now), "learnedCostMs": learned}

    def drain(self, now: float) -> list[T]:
        """Remove every job (to fail them all)."""
        jobs = [job for p in sorted(self._levels, reverse=True) for _, job in self._levels[p]]
        self._levels.clear()
        self._count = 0
        return jobs
