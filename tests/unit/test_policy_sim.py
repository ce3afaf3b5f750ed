"""Ferry's batch policies on a simulated clock, against cases solved by hand and against
the ideal dispatcher."""

from __future__ import annotations

import random

import pytest

from ferry.batching.policies import AdaptivePolicy
from ferry.batching.registry import make_policy
from ferry_bench.arrivals import poisson_offsets
from ferry_bench.limit import simulate
from ferry_bench.policy_sim import FullBatchPolicy, simulate_policy

COST_MS = {1: 10.0, 2: 12.0, 3: 14.0, 4: 16.0}
"""A curve where batching pays: 100 req/s alone, 250 req/s in fours."""


def _poisson(rate: float, count: int, seed: int = 0) -> list[float]:
    offsets = poisson_offsets(rate, random.Random(seed))
    return [next(offsets) for _ in range(count)]


def test_immediate_is_the_ideal_dispatcher() -> None:
    arrivals = _poisson(150.0, 2000)
    policy = simulate_policy(make_policy("immediate"), arrivals, COST_MS, 4, 0.05, 1.0)
    ideal = simulate(arrivals, COST_MS, 4, round_trip_ms=1.0)
    assert policy.latencies_ms == pytest.approx(ideal.latencies_ms)
    assert policy.batch_sizes == ideal.batch_sizes


def test_fixed_window_holds_a_lone_request_for_the_whole_delay() -> None:
    result = simulate_policy(make_policy("fixed_window"), [0.0], COST_MS, 4, 0.05)
    assert result.latencies_ms == pytest.approx([60.0])  # 50 ms window, then 10 ms


def test_full_batch_goes_once_full_or_at_the_oldest_requests_delay() -> None:
    arrivals = [0.0, 0.01, 0.02, 0.03, 0.2]
    result = simulate_policy(FullBatchPolicy(), arrivals, COST_MS, 4, 0.05)
    # The first four fill a batch at 30 ms (done at 46 ms); the fifth waits out 50 ms alone.
    assert result.batch_sizes == [4, 1]
    assert result.latencies_ms == pytest.approx([46.0, 36.0, 26.0, 16.0, 60.0])


def test_adaptive_sends_lone_requests_at_once_at_low_load() -> None:
    arrivals = [float(second) for second in range(5)]  # 1 req/s, batches of one keep up
    result = simulate_policy(AdaptivePolicy(), arrivals, COST_MS, 4, 0.05)
    assert result.latencies_ms == pytest.approx([10.0] * 5)


def test_adaptive_waits_for_batches_that_keep_up_when_single_ones_cannot() -> None:
    # 200 req/s against 100 req/s alone. Once its rate has seen them, the policy waits for
    # the arrivals that make a batch of three (214 req/s): every batch but the trace's
    # last is three requests, sent as the third arrives, each answered within 24 ms.
    arrivals = [i / 200 for i in range(400)]
    result = simulate_policy(AdaptivePolicy(), arrivals, COST_MS, 4, 0.05)
    assert result.batch_sizes[-30:-1] == [3] * 29
    assert result.latencies_ms[300:303] == pytest.approx([24.0, 19.0, 14.0])
    assert max(result.latencies_ms[300:-1]) == pytest.approx(24.0)  # the last waits alone


def test_costs_must_cover_every_batch_size() -> None:
    with pytest.raises(ValueError, match="every batch size"):
        simulate_policy(make_policy("immediate"), [0.0], {1: 10.0, 4: 16.0}, 4, 0.05)
