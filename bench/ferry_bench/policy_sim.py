"""Ferry's batch policies on a simulated clock: the same arrivals and cost curve for each,
with no server around them.

``ferry_bench.limit.simulate`` is the ideal (greedy) dispatcher. This module drives the
real policy objects of ``ferry.batching.policies`` instead, one worker, so that a
policy's own latency can be told apart from what the server around it costs: a benchmark
that finds a peer's p99 below Ferry's can ask whether Ferry's policy, run on the peer's
terms, would have done better, or whether the difference lies elsewhere.

The worker's cost model starts out knowing the curve (a server learns it within its first
batches), and the service time of a batch of ``b`` is ``cost_ms[b]``, as in ``simulate``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from ferry.batching.policies import BatchPolicy, CostModel, Decision, QueueState
from ferry_bench.limit import Simulated


class FullBatchPolicy:
    """Triton's dynamic batcher without preferred sizes: a batch waits to be full, for at
    most ``max_queue_delay`` after its oldest request arrived."""

    name = "full_batch"

    def arrived(self, now: float) -> None:
        pass

    def decide(self, state: QueueState) -> Decision:
        if state.queued == 0:
            return Decision(dispatch=False)
        bound = state.oldest_arrival + state.max_delay
        if state.queued >= state.batch_size or state.now >= bound:
            return Decision(dispatch=True, reason="full_or_delay")
        return Decision(dispatch=False, wake_at=bound)

    def describe(self, now: float) -> dict[str, Any]:
        return {"policy": self.name}


def simulate_policy(
    policy: BatchPolicy,
    arrivals_s: Sequence[float],
    cost_ms: Mapping[int, float],
    batch_size: int,
    max_delay_s: float,
    round_trip_ms: float = 0.0,
) -> Simulated:
    """One worker asking ``policy`` whenever it is free or the policy asked to be woken.

    ``arrivals_s`` must be sorted; ``cost_ms`` must cover 1..``batch_size``. Latencies are
    in arrival order, plus ``round_trip_ms``, as ``ferry_bench.limit.simulate`` gives them.
    """
    if batch_size < 1 or any(b not in cost_ms for b in range(1, batch_size + 1)):
        raise ValueError("cost_ms must cover every batch size from 1 to batch_size")
    costs = CostModel()
    for size, ms in cost_ms.items():
        costs.observe(size, ms / 1000)
    queue: deque[int] = deque()
    latencies = [0.0] * len(arrivals_s)
    sizes: list[int] = []
    now = free_since = 0.0
    admitted = 0
    while admitted < len(arrivals_s) or queue:
        while admitted < len(arrivals_s) and arrivals_s[admitted] <= now:
            policy.arrived(arrivals_s[admitted])
            queue.append(admitted)
            admitted += 1
        next_arrival = arrivals_s[admitted] if admitted < len(arrivals_s) else math.inf
        if not queue:
            now = next_arrival
            continue
        state = QueueState(
            now, len(queue), arrivals_s[queue[0]], free_since, batch_size, max_delay_s, costs
        )
        decision = policy.decide(state)
        if decision.dispatch:
            batch = [queue.popleft() for _ in range(min(batch_size, len(queue)))]
            now = free_since = now + cost_ms[len(batch)] / 1000
            sizes.append(len(batch))
            for index in batch:
                latencies[index] = (now - arrivals_s[index]) * 1000 + round_trip_ms
            continue
        wake = math.inf if decision.wake_at is None else max(decision.wake_at, now)
        if min(wake, next_arrival) == math.inf:
            raise RuntimeError(
                f"{policy.name} holds {len(queue)} requests with nothing to wait for"
            )
        if wake <= now and next_arrival > now:
            raise RuntimeError(f"{policy.name} asked to wait until now without dispatching")
        now = min(wake, next_arrival)
    return Simulated(latencies, sizes)
