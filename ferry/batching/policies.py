"""When to hand a batch to an idle worker: pluggable policies, pure logic, clock passed in.

A model's queue asks its policy whenever a worker is free (``decide``) and tells it what
happens (``arrived``, ``batch_timed``). Three policies, chosen per model
(``batchPolicy`` in model-config.yaml) by name from ``ferry.batching.registry``:

``adaptive`` (the default)
    Work-conserving unless waiting pays. With q requests queued and arrivals at rate λ
    (requests in the last ``RATE_WINDOW`` seconds, or less when the last few arrivals
    are spread out: a lull after a burst shows at once), batches of q keep up when
    q / cost(q) >= λ, and then the batch goes now: a lone request at low load never
    waits. Only when they cannot keep up does it wait,
    for the arrivals that make the smallest batch b that can (b / cost(b) >= λ), and
    never past ``maxBatchDelay`` from the oldest request's arrival, nor past the point
    where the oldest request would miss ``latencyObjectiveMs``. cost(b) is learned from
    the worker's own batch timings (``CostModel``); without evidence it does not wait.
``immediate``
    Triton's default: whatever is queued (up to the batch size) goes when a worker is free.
``fixed_window``
    TorchServe's: a worker takes the first request, then waits up to ``maxBatchDelay``
    from that moment for the batch to fill.

Every decision names its reason (``full``, ``delay_bound``, ``idle_worker``,
``cost_model``, ``deadline``, ``window``), counted per model in the metrics.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

RATE_WINDOW = 1.0
"""Seconds of arrivals the adaptive policy's rate counts: a burst is forgotten within it."""
RECENT_ARRIVALS = 3
"""Arrivals the adaptive policy's short-term rate spans, up to now: right after a burst,
the silence since its last arrivals shows the rate has dropped long before the window
forgets the burst."""
COST_SMOOTHING = 0.2
"""Weight of a new batch timing in its size's running cost."""
SEED_TIMINGS = 3
"""Timings of a size whose lowest is its cost before the running mean takes over: a
worker's first batches of a size pay one-off costs (lazy initialisation, the allocator
growing, cold caches: a fresh ResNet-18 worker's first batches of one took 47 and 37 ms,
later ones 25), which only ever make a batch slower. Averaged in, they made the size look
dear for dozens of batches: after six requests to the demo model, 37 ms learned for a
batch that takes 3, so ``adaptive`` waited for nothing and requests with a 20 ms deadline
were shed. Once a size is seeded, a worker's first batch of it (a replacement's, a
recycled or scaled-up worker's) is left out."""


@dataclass(frozen=True)
class Decision:
    dispatch: bool
    wake_at: float | None = None
    """When not dispatching: when to decide again at the latest (None: on the next arrival)."""
    reason: str = ""


@dataclass(frozen=True)
class QueueState:
    """What a policy sees of the queue when a worker asks for work."""

    now: float
    queued: int
    oldest_arrival: float
    worker_free_since: float
    """When the asking worker started waiting (TorchServe's window starts there)."""
    batch_size: int
    max_delay: float
    costs: CostModel
    """The model's batch costs, learned by its queue from worker timings (policies share
    it, so switching policy loses no evidence)."""


class BatchPolicy(Protocol):
    name: str

    def arrived(self, now: float) -> None: ...

    def decide(self, state: QueueState) -> Decision: ...

    def describe(self, now: float) -> dict[str, Any]: ...


def _common(state: QueueState) -> Decision | None:
    """Rules every policy shares: nothing queued waits for an arrival; a full batch goes."""
    if state.queued == 0:
        return Decision(dispatch=False)
    if state.queued >= state.batch_size:
        return Decision(dispatch=True, reason="full")
    return None


class ImmediatePolicy:
    name = "immediate"

    def arrived(self, now: float) -> None:
        pass

    def decide(self, state: QueueState) -> Decision:
        return _common(state) or Decision(dispatch=True, reason="idle_worker")

    def describe(self, now: float) -> dict[str, Any]:
        return {"policy": self.name}


class FixedWindowPolicy:
    name = "fixed_window"

    def arrived(self, now: float) -> None:
        pass

    def decide(self, state: QueueState) -> Decision:
        shared = _common(state)
        if shared is not None:
            return shared
        window_end = max(state.oldest_arrival, state.worker_free_since) + state.max_delay
        if state.now >= window_end:
            return Decision(dispatch=True, reason="window")
        return Decision(dispatch=False, wake_at=window_end)

    def describe(self, now: float) -> dict[str, Any]:
        return {"policy": self.name}


class RecentRate:
    """Arrivals per second over the last ``window`` seconds."""

    def __init__(self, window: float = RATE_WINDOW) -> None:
        self.window = window
        self._times: deque[float] = deque()

    def add(self, now: float) -> None:
        self._times.append(now)
        self._forget(now)

    def per_second(self, now: float) -> float:
        self._forget(now)
        return len(self._times) / self.window

    def current(self, now: float) -> float:
        """The lower of the window's rate and the rate of the last ``RECENT_ARRIVALS``
        arrivals counted up to now: a rate that has just fallen shows at once, one that
        rises shows within the window."""
        window_rate = self.per_second(now)
        if len(self._times) < RECENT_ARRIVALS:
            return window_rate
        span = now - self._times[-RECENT_ARRIVALS]
        return window_rate if span <= 0 else min(window_rate, RECENT_ARRIVALS / span)

    def _forget(self, now: float) -> None:
        while self._times and self._times[0] <= now - self.window:
            self._times.popleft()


class CostModel:
    """A batch's cost by size, learned from the workers' timings (the lowest of a size's
    first ``SEED_TIMINGS``, then a running mean without workers' first batches of the
    size); sizes not seen are interpolated between seen ones, and beyond the largest seen
    assumed to cost proportionally more (no gain claimed without evidence)."""

    def __init__(self, smoothing: float = COST_SMOOTHING, seed_timings: int = SEED_TIMINGS) -> None:
        self.smoothing = smoothing
        self.seed_timings = seed_timings
        self.seconds: dict[int, float] = {}
        self.timings: dict[int, int] = {}
        """Timings seen per size."""

    def observe(self, size: int, seconds: float, *, workers_first: bool = False) -> None:
        """A batch of ``size`` took ``seconds``; ``workers_first``: its worker's first of
        that size."""
        seen = self.timings.get(size, 0)
        if size < 1 or seconds <= 0 or (workers_first and seen >= self.seed_timings):
            return
        old = self.seconds.get(size)
        self.timings[size] = seen + 1
        if old is None:
            self.seconds[size] = seconds
        elif seen < self.seed_timings:
            self.seconds[size] = min(old, seconds)
        else:
            self.seconds[size] = old + self.smoothing * (seconds - old)

    def cost(self, size: int) -> float | None:
        if size in self.seconds:
            return self.seconds[size]
        if not self.seconds:
            return None
        known = sorted(self.seconds)
        below = [k for k in known if k < size]
        above = [k for k in known if k > size]
        if below and above:
            low, high = below[-1], above[0]
            share = (size - low) / (high - low)
            return self.seconds[low] + share * (self.seconds[high] - self.seconds[low])
        if below:  # beyond the largest seen: proportional, no gain assumed
            return self.seconds[below[-1]] * size / below[-1]
        return self.seconds[above[0]] * size / above[0]  # below the smallest seen

    def throughput(self, size: int) -> float | None:
        """Requests per second a stream of batches of ``size`` sustains."""
        cost = self.cost(size)
        return None if cost is None or cost <= 0 else size / cost


class AdaptivePolicy:
    name = "adaptive"

    def __init__(self, latency_objective: float | None = None) -> None:
        self.latency_objective = latency_objective
        """Seconds; waiting never makes the oldest request's expected latency exceed it."""
        self.rate = RecentRate()

    def arrived(self, now: float) -> None:
        self.rate.add(now)

    def decide(self, state: QueueState) -> Decision:
        shared = _common(state)
        if shared is not None:
            return shared
        bound = state.oldest_arrival + state.max_delay
        if state.now >= bound:
            return Decision(dispatch=True, reason="delay_bound")
        rate = self.rate.current(state.now)
        costs = state.costs
        keeps_up = costs.throughput(state.queued)
        if rate <= 0 or keeps_up is None or keeps_up >= rate:
            return Decision(dispatch=True, reason="idle_worker")  # waiting cannot pay
        target = _smallest_sustainable(costs, state.queued, state.batch_size, rate)
        wake = min(bound, state.now + (target - state.queued) / rate)
        if self.latency_objective is not None:
            cost = costs.cost(target) or 0.0
            latest = state.oldest_arrival + self.latency_objective - cost
            if latest <= state.now:
                return Decision(dispatch=True, reason="deadline")
            wake = min(wake, latest)
        return Decision(dispatch=False, wake_at=wake, reason="cost_model")

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "policy": self.name,
            "arrivalsPerSecond": self.rate.current(now),
            "latencyObjectiveMs": (
                None if self.latency_objective is None else self.latency_objective * 1000
            ),
        }


def _smallest_sustainable(costs: CostModel, queued: int, batch_size: int, rate: float) -> int:
    """The smallest batch above ``queued`` whose stream keeps up with ``rate`` (else the
    batch size)."""
    for size in range(queued + 1, batch_size + 1):
        sustained = costs.throughput(size)
        if sustained is not None and sustained >= rate:
            return size
    return batch_size


__all__ = [
    "AdaptivePolicy",
    "BatchPolicy",
    "CostModel",
    "Decision",
    "FixedWindowPolicy",
    "ImmediatePolicy",
    "QueueState",
    "RecentRate",
]
