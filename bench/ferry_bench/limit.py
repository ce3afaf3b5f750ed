"""How far a server is from the limit its model sets: bounds from per-batch costs, and an
ideal dispatcher simulated on the same arrivals.

From a profile's cost per batch ``cost(b)`` (each stage's median, in ms) and the server's
round trip on a no-op model ``r``:

- latency floor ``L0 = cost(1) + r``: no request can be answered faster;
- throughput ceiling ``X*``: ``max b/cost(b)`` with stages run one after the other, or
  ``max b/max_s cost_s(b)`` when stages overlap (a pipelined worker), per worker;
- SLO-bounded capacity ``X_SLO``: the best ``b/cost(b)`` with ``2 x cost(b) <= SLO`` (a request
  may wait for the batch in service, then be served in the next);
- ``simulate``: an ideal dispatcher (no overhead, never idle while requests wait, never
  waits to fill a batch) fed an arrival trace, so a measured p99 has a partner: the p99
  the same trace would get from a perfect server with this model.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ferry_bench.stats import percentile

StageCosts = Mapping[int, Mapping[str, float]]
"""Batch size -> stage name -> median ms of one batch of that size."""


def batch_ms(costs: StageCosts, batch: int) -> float:
    """``cost(b)``: the stages one after the other."""
    return sum(costs[batch].values())


def bottleneck_ms(costs: StageCosts, batch: int) -> float:
    """The slowest stage of a batch: what a pipelined worker pays per batch at steady state."""
    return max(costs[batch].values())


@dataclass(frozen=True)
class Bounds:
    floor_ms: float
    """``L0``: batch-1 cost plus the server's round trip."""
    ceiling_sequential: float
    """``X*`` in requests/s, stages in sequence, times workers."""
    ceiling_pipelined: float
    """``X*`` with stages overlapping, times workers."""
    best_batch: int
    """The batch size reaching ``ceiling_sequential``."""
    slo_capacity: float | None
    """``X_SLO`` in requests/s (None when even a batch of one breaks ``2 x cost(b) <= SLO``)."""
    slo_batch: int | None


def bounds(costs: StageCosts, round_trip_ms: float, slo_ms: float, workers: int = 1) -> Bounds:
    """The limit's figures; ``costs`` must hold batch size 1."""
    if 1 not in costs:
        raise ValueError("the profile needs batch size 1 for the latency floor")
    sizes = sorted(costs)
    rate = {b: b * 1000 / batch_ms(costs, b) for b in sizes}
    best = max(sizes, key=lambda b: rate[b])
    pipelined = max(b * 1000 / bottleneck_ms(costs, b) for b in sizes)
    within = [b for b in sizes if 2 * batch_ms(costs, b) <= slo_ms]
    slo_batch = max(within, key=lambda b: rate[b]) if within else None
    return Bounds(
        floor_ms=batch_ms(costs, 1) + round_trip_ms,
        ceiling_sequential=rate[best] * workers,
        ceiling_pipelined=pipelined * workers,
        best_batch=best,
        slo_capacity=rate[slo_batch] * workers if slo_batch is not None else None,
        slo_batch=slo_batch,
    )


def cost_function(costs: StageCosts) -> dict[int, float]:
    """``cost(b)`` for every b up to the largest profiled, each size not profiled costed as
    the next profiled size up (a batch of 3 pays what the batch of 4 costs: an upper
    bound, never a guess below what was measured)."""
    sizes = sorted(costs)
    table = {}
    for b in range(1, sizes[-1] + 1):
        table[b] = batch_ms(costs, next(s for s in sizes if s >= b))
    return table


@dataclass(frozen=True)
class Simulated:
    latencies_ms: list[float]
    """Per request, in arrival order: queueing plus service, plus the round trip."""
    batch_sizes: list[int]

    def latency_ms(self, q: float) -> float:
        return percentile(self.latencies_ms, q)


def simulate(
    arrivals_s: Sequence[float],
    cost_ms: Mapping[int, float],
    max_batch: int,
    workers: int = 1,
    round_trip_ms: float = 0.0,
) -> Simulated:
    """An ideal dispatcher: whenever a worker is free and requests wait, it takes up to
    ``max_batch`` of them at once (oldest first) and is busy ``cost_ms[size]``. No batch
    delay, no overhead but ``round_trip_ms`` added to every answer.

    >>> [round(ms, 6) for ms in simulate([0, 0, 0], {1: 10.0, 2: 12.0}, 2).latencies_ms]
    [12.0, 12.0, 22.0]
    """
    if max_batch < 1 or workers < 1:
        raise ValueError("max_batch and workers must be at least 1")
    largest = min(max_batch, max(cost_ms))
    order = sorted(range(len(arrivals_s)), key=lambda i: arrivals_s[i])
    waiting: deque[int] = deque()
    free_at = [0.0] * workers  # a heap of the times each worker is next free
    heapq.heapify(free_at)
    latencies = [0.0] * len(arrivals_s)
    sizes: list[int] = []
    next_arrival = 0
    while next_arrival < len(order) or waiting:
        worker_free = free_at[0]
        if not waiting:  # idle until the next arrival
            start = max(worker_free, arrivals_s[order[next_arrival]])
        else:
            start = max(worker_free, arrivals_s[waiting[0]])
        while next_arrival < len(order) and arrivals_s[order[next_arrival]] <= start:
            waiting.append(order[next_arrival])
            next_arrival += 1
        batch = [waiting.popleft() for _ in range(min(largest, len(waiting)))]
        done = start + cost_ms[len(batch)] / 1000
        heapq.heapreplace(free_at, done)
        sizes.append(len(batch))
        for index in batch:
            latencies[index] = (done - arrivals_s[index]) * 1000 + round_trip_ms
    return Simulated(latencies, sizes)
