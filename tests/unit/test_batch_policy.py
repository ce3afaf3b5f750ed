"""The batch policies and the queue they cut batches from, with an injected clock: no
sockets, no sleeps."""

from __future__ import annotations

import pytest

from ferry.batching.policies import (
    AdaptivePolicy,
    CostModel,
    FixedWindowPolicy,
    ImmediatePolicy,
    QueueState,
    RecentRate,
)
from ferry.batching.registry import make_policy
from ferry.errors import Overloaded
from ferry.scheduling.assembler import BatchAssembler

COSTS = CostModel()
"""What ``_state`` hands policies; ``_learned`` fills it."""


def _state(now: float, queued: int, oldest: float = 0.0, **kwargs: float) -> QueueState:
    values: dict[str, float] = {"worker_free_since": 0.0, "batch_size": 8, "max_delay": 0.05}
    values.update(kwargs)
    return QueueState(
        now=now,
        queued=queued,
        oldest_arrival=oldest,
        worker_free_since=values["worker_free_since"],
        batch_size=int(values["batch_size"]),
        max_delay=values["max_delay"],
        costs=COSTS,
    )


@pytest.fixture(autouse=True)
def _no_costs_yet() -> None:
    COSTS.seconds.clear()
    COSTS.timings.clear()


def _learned(policy: AdaptivePolicy, costs_ms: dict[int, float]) -> AdaptivePolicy:
    for size, ms in costs_ms.items():
        COSTS.observe(size, ms / 1000)
    return policy


def _arrivals(policy: AdaptivePolicy, start: float, rate: float, seconds: float) -> float:
    """Arrivals every 1/rate seconds from ``start``; returns the time after the last."""
    now, gap = start, 1 / rate
    while now < start + seconds:
        policy.arrived(now)
        now += gap
    return now


# --- shared rules -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["adaptive", "immediate", "fixed_window"])
def test_every_policy_sends_a_full_batch_and_waits_on_an_empty_queue(name: str) -> None:
    policy = make_policy(name)
    full = policy.decide(_state(0.0, 8))
    assert full.dispatch and full.reason == "full"
    empty = policy.decide(_state(0.0, 0))
    assert not empty.dispatch and empty.wake_at is None


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="adaptive, immediate, fixed_window"):
        make_policy("greedy")


# --- immediate and fixed_window -------------------------------------------------------------


def test_immediate_sends_whatever_is_queued() -> None:
    decision = ImmediatePolicy().decide(_state(0.0, 1))
    assert decision.dispatch and decision.reason == "idle_worker"


def test_fixed_window_waits_the_delay_from_when_the_worker_took_the_first_request() -> None:
    policy = FixedWindowPolicy()
    # The request arrived at 0 while the worker was busy; the worker freed up at 0.1.
    waiting = policy.decide(_state(0.1, 1, oldest=0.0, worker_free_since=0.1))
    assert not waiting.dispatch and waiting.wake_at == pytest.approx(0.15)
    # A request arriving at an idle worker: the window starts at its arrival.
    idle = policy.decide(_state(0.2, 1, oldest=0.2, worker_free_since=0.1))
    assert not idle.dispatch and idle.wake_at == pytest.approx(0.25)
    late = policy.decide(_state(0.16, 3, oldest=0.0, worker_free_since=0.1))
    assert late.dispatch and late.reason == "window"


# --- adaptive ---------------------------------------------------------------------------


def test_adaptive_without_evidence_never_waits() -> None:
    decision = AdaptivePolicy().decide(_state(0.0, 1))
    assert decision.dispatch and decision.reason == "idle_worker"


def test_adaptive_sends_a_lone_request_at_once_when_batches_of_one_keep_up() -> None:
    policy = _learned(AdaptivePolicy(), {1: 10.0, 8: 20.0})
    now = _arrivals(policy, 0.0, rate=50.0, seconds=2.0)  # 50/s; batches of 1 do 100/s
    decision = policy.decide(_state(now, 1, oldest=now))
    assert decision.dispatch and decision.reason == "idle_worker"


def test_adaptive_waits_for_the_smallest_batch_that_keeps_up() -> None:
    policy = _learned(AdaptivePolicy(), {1: 10.0, 4: 12.0, 8: 20.0})  # 100, 333, 400/s
    now = _arrivals(policy, 0.0, rate=300.0, seconds=1.0)
    decision = policy.decide(_state(now, 1, oldest=now))
    # Batches of 4 sustain 333/s >= 300/s: wait for three more arrivals (10 ms), no longer.
    assert not decision.dispatch and decision.reason == "cost_model"
    assert decision.wake_at == pytest.approx(now + 3 / 300, rel=0.05)
    # With the three there, a batch of four keeps up: it goes.
    assert policy.decide(_state(now + 0.01, 4, oldest=now)).reason == "idle_worker"


def test_adaptive_never_waits_past_the_delay_bound_from_arrival() -> None:
    policy = _learned(AdaptivePolicy(), {1: 10.0, 8: 20.0})
    now = _arrivals(policy, 0.0, rate=1000.0, seconds=1.0)  # nothing keeps up: wait for 8
    # Seven more arrivals would take 7 ms, but the oldest reaches the 50 ms bound in 5.
    waiting = policy.decide(_state(now, 1, oldest=now - 0.045))
    assert not waiting.dispatch and waiting.wake_at == pytest.approx(now + 0.005)
    bound = policy.decide(_state(now + 0.005, 3, oldest=now - 0.045))
    assert bound.dispatch and bound.reason == "delay_bound"


def test_adaptive_forgets_a_burst_within_a_second() -> None:
    policy = _learned(AdaptivePolicy(), {1: 30.0, 8: 60.0})  # 33/s alone, 133/s in eights
    _arrivals(policy, 0.0, rate=800.0, seconds=0.2)  # 160 requests in a burst
    assert not policy.decide(_state(0.25, 1, oldest=0.25)).dispatch  # still bursting
    # Then lone requests: from 1 s after the burst, each goes at once.
    for now in (1.25, 1.5, 2.0, 5.0):
        policy.arrived(now)
        decision = policy.decide(_state(now, 1, oldest=now))
        assert decision.dispatch and decision.reason == "idle_worker", now


def test_adaptive_keeps_the_oldest_request_within_the_latency_objective() -> None:
    policy = _learned(AdaptivePolicy(latency_objective=0.03), {1: 10.0, 8: 20.0})
    now = _arrivals(policy, 0.0, rate=1000.0, seconds=1.0)
    # The oldest arrived 5 ms ago; a batch of 8 costs 20 ms: it may wait 5 ms more.
    waiting = policy.decide(_state(now, 2, oldest=now - 0.005))
    assert not waiting.dispatch and waiting.wake_at == pytest.approx(now + 0.005)
    later = _arrivals(policy, now, rate=1000.0, seconds=0.005)  # arrivals go on meanwhile
    late = policy.decide(_state(later, 3, oldest=now - 0.005))
    assert late.dispatch and late.reason == "deadline"


def test_recent_rate_counts_the_last_window_only() -> None:
    rate = RecentRate(window=1.0)
    assert rate.per_second(0.0) == 0.0
    for step in range(100):
        rate.add(step * 0.01)
    assert rate.per_second(0.99) == pytest.approx(100.0)
    assert rate.per_second(1.5) == pytest.approx(49.0)
    assert rate.per_second(2.0) == 0.0


def test_the_current_rate_drops_at_once_when_arrivals_thin_out() -> None:
    rate = RecentRate(window=1.0)
    for step in range(100):
        rate.add(step * 0.01)  # 100/s until 0.99
    assert rate.current(0.995) == pytest.approx(100.0)  # the window: a steady stream
    # 0.3 s of silence, then one arrival: the last three span 0.32 s, not 0.02.
    rate.add(1.29)
    assert rate.current(1.29) == pytest.approx(3 / (1.29 - 0.98))
    assert rate.per_second(1.29) == pytest.approx(71.0)  # the window still counts the burst


def test_a_lone_request_right_after_a_burst_is_not_held_back() -> None:
    """The defect this policy replaced: after a burst, lone requests waited up to the full
    delay for company that no longer came."""
    policy = _learned(AdaptivePolicy(), {1: 30.0, 2: 35.0, 4: 45.0, 8: 60.0})
    end = _arrivals(policy, 0.0, rate=100.0, seconds=1.0)
    during = policy.decide(_state(end - 0.005, 1, oldest=end - 0.005))
    assert not during.dispatch  # mid-burst, a lone request waits for a bigger batch
    lone = end + 0.25
    policy.arrived(lone)
    after = policy.decide(_state(lone, 1, oldest=lone))
    assert after.dispatch and after.reason == "idle_worker"


def test_a_sizes_cold_first_batches_do_not_make_it_look_dear() -> None:
    costs = CostModel(smoothing=0.5, seed_timings=3)
    for ms in (98, 30, 28):  # the first batch of one pays the model's one-off start-up
        costs.observe(1, ms / 1000)
    assert costs.cost(1) == pytest.approx(0.028)  # the lowest of the first three
    costs.observe(1, 0.032)  # from then on a running mean: it follows a real change
    assert costs.cost(1) == pytest.approx(0.030)
    costs.observe(1, 0.090, workers_first=True)  # a new worker's first: left out
    assert costs.cost(1) == pytest.approx(0.030) and costs.timings[1] == 4
    costs.observe(2, 0.090, workers_first=True)  # but it seeds a size like any other
    assert costs.cost(2) == pytest.approx(0.090)  # one timing is all there is to go on


def test_after_a_cold_start_a_lone_request_goes_at_once_and_its_deadline_stands() -> None:
    queue = BatchAssembler[int](8, 0.05, 10, AdaptivePolicy())
    queue.batch_timed(8, 0.120)
    queue.batch_timed(1, 0.098)  # cold: batches of one look slower than they are
    queue.batch_timed(1, 0.028)
    # 20 requests a second: batches of one keep up at 28 ms (36/s), not at 98 (10/s)
    for arrival in range(20):
        queue.policy.arrived(arrival * 0.05)
    queue.put(1, 1.0)
    assert queue.poll(1.0) == ([1], "idle_worker")
    assert queue.costs.cost(1) == pytest.approx(0.028)  # what shedding by deadline uses


def test_cost_model_learns_interpolates_and_claims_no_gain_beyond_evidence() -> None:
    costs = CostModel(smoothing=0.5, seed_timings=1)
    assert costs.cost(1) is None and costs.throughput(1) is None
    costs.observe(1, 0.010)
    costs.observe(1, 0.020)  # running mean: halfway
    costs.observe(4, 0.030)
    assert costs.cost(1) == pytest.approx(0.015)
    assert costs.cost(2) == pytest.approx(0.020)  # a third of the way from 1 to 4
    assert costs.cost(8) == pytest.approx(0.060)  # beyond 4: proportional
    assert costs.throughput(4) == pytest.approx(4 / 0.030)
    costs.observe(3, 0.0)  # nonsense timings are ignored
    assert 3 not in costs.seconds
    queue = BatchAssembler[int](4, 0.05, 10, AdaptivePolicy())
    queue.batch_timed(1, 0.010)
    described = queue.describe(0.0)
    assert described["policy"] == "adaptive" and described["learnedCostMs"] == {"1": 10.0}


# --- the queue ------------------------------------------------------------------------------


def _queue(
    batch_size: int = 4, capacity: int = 100, policy: str = "adaptive"
) -> BatchAssembler[int]:
    return BatchAssembler[int](batch_size, 0.05, capacity, make_policy(policy))


def test_idle_worker_takes_a_lone_request_at_once() -> None:
    queue = _queue()
    queue.put(1, now=10.0)
    assert queue.poll(now=10.0) == ([1], "idle_worker")


def test_batch_is_capped_at_batch_size_and_keeps_order() -> None:
    queue = _queue(batch_size=3)
    for i in range(7):
        queue.put(i, i * 0.001)
    assert queue.take(now=1.0) == [0, 1, 2]
    assert queue.poll(now=1.0) == ([3, 4, 5], "full")
    assert queue.take(now=1.0) == [6]


def test_closed_loop_single_client_never_waits() -> None:
    queue = _queue(batch_size=8)
    now = 0.0
    for i in range(100):
        queue.put(i, now)
        assert queue.poll(now) == ([i], "idle_worker")
        queue.batch_timed(1, 0.002)
        now += 0.002


def test_full_queue_is_refused() -> None:
    queue = _queue(capacity=2)
    queue.put(1, 0.0)
    queue.put(2, 0.0)
    with pytest.raises(Overloaded):
        queue.put(3, 0.0)
    queue.take(0.0)
    queue.put(3, 0.0)


def test_retried_jobs_go_back_to_the_front() -> None:
    queue = _queue(batch_size=2)
    queue.put(3, 0.0)
    queue.put_front([1, 2], 0.1)
    assert queue.take(0.1) == [1, 2]
    assert queue.drain(0.2) == [3]


def test_two_idle_workers_each_take_their_own_request() -> None:
    import asyncio

    from ferry.scheduling.batch_queue import BatchQueue

    clock = [0.0]
    released: list[tuple[str, int]] = []

    async def scenario() -> None:
        queue = BatchQueue[int](
            8,
            0.05,
            100,
            lambda: clock[0],
            make_policy("adaptive"),
            on_dispatch=lambda r, n: released.append((r, n)),
        )
        first = asyncio.ensure_future(queue.take_batch())
        second = asyncio.ensure_future(queue.take_batch())
        await asyncio.sleep(0)  # both workers are waiting
        queue.put(1)
        done, pending = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
        assert [task.result() for task in done] == [[1]]
        queue.put(2)
        (other,) = pending
        assert await other == [2]

    asyncio.run(asyncio.wait_for(scenario(), 5))
    assert released == [("idle_worker", 1), ("idle_worker", 1)]


def test_switching_policy_keeps_the_queue_and_wakes_waiting_workers() -> None:
    import asyncio

    from ferry.scheduling.batch_queue import BatchQueue

    clock = [0.0]

    async def scenario() -> None:
        queue = BatchQueue[int](8, 10.0, 100, lambda: clock[0], make_policy("fixed_window"))
        taking = asyncio.ensure_future(queue.take_batch())
        queue.put(1)
        queue.put(2)
        await asyncio.sleep(0)
        assert not taking.done()  # fixed_window: waits up to 10 s for the batch to fill
        queue.set_policy(make_policy("immediate"))
        assert await taking == [1, 2]
        assert queue.policy.name == "immediate"

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_higher_priorities_go_first_and_each_priority_keeps_its_order() -> None:
    queue = _queue(batch_size=3)
    for now, (job, priority) in enumerate([(1, 0), (2, 0), (3, 5), (4, -1), (5, 5), (6, 0)]):
        queue.put(job, float(now), priority)
    assert queue.take(10.0) == [3, 5, 1]
    assert queue.take(10.0) == [2, 6, 4]
    assert len(queue) == 0


def test_the_delay_bound_counts_from_the_oldest_request_of_any_priority() -> None:
    queue = _queue(batch_size=4, policy="fixed_window")
    queue.put(1, now=0.0, priority=0)
    queue.put(2, now=0.04, priority=3)
    assert not queue.decision(0.049, worker_free_since=0.0).dispatch
    decision = queue.decision(0.05, worker_free_since=0.0)
    assert decision.dispatch and decision.reason == "window"
    assert queue.take(0.05) == [2, 1]


def test_a_full_queue_refuses_every_priority_and_retries_keep_theirs() -> None:

    queue = _queue(batch_size=2, capacity=2)
    queue.put(1, 0.0, priority=0)
    queue.put(2, 0.0, priority=0)
    with pytest.raises(Overloaded):
        queue.put(3, 0.0, priority=100)
    assert queue.take(0.0) == [1, 2]
    queue.put(4, 0.1, priority=0)
    queue.put_front([2], 0.2, priority=9)  # a retried high-priority job: still first
    assert queue.take(0.2) == [2, 4]
    queue.put(5, 0.3, priority=1)
    queue.put(6, 0.3, priority=0)
    assert queue.drain(0.4) == [5, 6]


def test_a_demoted_job_goes_behind_every_priority_and_keeps_its_arrival() -> None:
    queue = _queue(batch_size=4, policy="fixed_window")
    queue.put(1, now=0.0, priority=0)
    queue.put(2, now=0.01, priority=0)
    queue.put(3, now=0.02, priority=-100)
    assert queue.demote(1, priority=-1000)
    assert not queue.demote(9, priority=-1000)  # not queued: nothing to move
    # The delay bound still counts from job 1's arrival, the oldest.
    assert not queue.decision(0.049, worker_free_since=0.0).dispatch
    assert queue.decision(0.05, worker_free_since=0.0).dispatch
    assert queue.take(0.05) == [2, 3, 1]
    assert len(queue) == 0


def test_the_asyncio_queue_files_each_job_under_its_own_priority() -> None:
    from ferry.scheduling.batch_queue import BatchQueue

    queue = BatchQueue[int](
        4, 0.0, 100, lambda: 0.0, make_policy("immediate"), priority_of=lambda job: job // 10
    )
    for job in (1, 22, 13):
        queue.put(job)
    queue.put_front([35, 2])  # retried: each back under its priority, ahead of its level
    assert queue.take_ready() == [35, 22, 13, 2]
    assert queue.take_ready() == [1]
