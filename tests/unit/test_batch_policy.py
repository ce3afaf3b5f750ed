"""The batching rules, with an injected clock: no sockets, no sleeps."""

from __future__ import annotations

from functools import partial

import pytest

from ferry.errors import Overloaded
from ferry.scheduling.assembler import BatchAssembler
from ferry.scheduling.batch_policy import WaitingArrivalRate, decide


def _assembler(
    batch_size: int = 4, max_delay: float = 0.05, capacity: int = 100
) -> BatchAssembler[int]:
    return BatchAssembler[int](batch_size, max_delay, capacity)


def _build_load(queue: BatchAssembler[int], start: float, gap: float, count: int) -> float:
    """Requests arriving every ``gap`` seconds while no worker takes them (workers busy)."""
    now = start
    for i in range(count):
        queue.put(i, now)
        now += gap
    return now


def test_idle_worker_takes_a_lone_request_at_once() -> None:
    queue = _assembler()
    queue.put(1, now=10.0)
    assert queue.poll(now=10.0) == [1]


def test_busy_workers_let_requests_accumulate_and_the_next_batch_takes_them_all() -> None:
    queue = _assembler(batch_size=8)
    now = _build_load(queue, 0.0, 0.001, 5)
    # A worker frees up: it takes everything queued; nothing is left behind to wait.
    assert queue.poll(now=now + 0.1) == [0, 1, 2, 3, 4]
    assert len(queue) == 0


def test_batch_is_capped_at_batch_size_and_keeps_order() -> None:
    queue = _assembler(batch_size=3)
    _build_load(queue, 0.0, 0.001, 7)
    assert queue.take(now=1.0) == [0, 1, 2]
    assert queue.take(now=1.0) == [3, 4, 5]
    assert queue.take(now=1.0) == [6]


def test_full_batch_goes_immediately_even_under_high_arrival_rate() -> None:
    queue = _assembler(batch_size=4)
    now = _build_load(queue, 0.0, 0.0001, 4)
    assert queue.decision(now).dispatch


def test_waits_for_more_when_requests_arrive_fast_while_others_wait() -> None:
    queue = _assembler(batch_size=8, max_delay=0.05)
    now = _build_load(queue, 0.0, 0.001, 20)  # 1000 req/s joined a waiting queue
    queue.take(now)
    queue.take(now)
    queue.take(now)  # drained: 0 left
    queue.put(100, now)
    decision = queue.decision(now)
    assert not decision.dispatch
    assert decision.wake_at is not None and now < decision.wake_at <= now + 0.05


def test_max_batch_delay_counts_from_the_oldest_arrival() -> None:
    queue = _assembler(batch_size=100, max_delay=0.05)
    now = _build_load(queue, 0.0, 0.001, 20)
    while len(queue):
        queue.take(now)
    start = now
    for i in range(50):  # a steady stream that never fills the batch
        queue.put(i, start + i * 0.001)
    assert not queue.decision(start + 0.045).dispatch
    assert queue.decision(start + 0.05).dispatch  # the oldest has waited max_batch_delay
    assert queue.poll(start + 0.05) == list(range(50))


def test_stream_gone_quiet_dispatches_before_the_deadline() -> None:
    queue = _assembler(batch_size=8, max_delay=1.0)
    now = _build_load(queue, 0.0, 0.001, 20)
    while len(queue):
        queue.take(now)
    queue.put(1, now)
    # No arrival for many expected gaps (1 ms each): waiting will not pay.
    assert queue.decision(now + 0.02).dispatch


def test_closed_loop_single_client_never_waits() -> None:
    # One client: each request arrives to an empty queue, after the previous one left.
    queue = _assembler(batch_size=8, max_delay=0.05)
    now = 0.0
    for i in range(100):
        queue.put(i, now)
        assert queue.poll(now) == [i]
        now += 0.002


def test_full_queue_is_refused() -> None:
    queue = _assembler(capacity=2)
    queue.put(1, 0.0)
    queue.put(2, 0.0)
    with pytest.raises(Overloaded):
        queue.put(3, 0.0)
    queue.take(0.0)
    queue.put(3, 0.0)


def test_retried_jobs_go_back_to_the_front() -> None:
    queue = _assembler(batch_size=2)
    queue.put(3, 0.0)
    queue.put_front([1, 2], 0.1)
    assert queue.take(0.1) == [1, 2]
    assert queue.drain(0.2) == [3]


def test_arrival_rate_counts_only_arrivals_into_a_waiting_queue() -> None:
    rate = WaitingArrivalRate(half_life=100.0)
    assert rate.per_second() == 0.0
    rate.advance(0.0, queue_was_waiting=False)
    rate.record_arrival(joined_waiting_queue=False)
    assert rate.per_second() == 0.0
    for step in range(1, 11):
        rate.advance(step * 0.01, queue_was_waiting=True)
        rate.record_arrival(joined_waiting_queue=True)
    assert rate.per_second() == pytest.approx(100.0, rel=0.01)


def test_decide_rules_in_isolation() -> None:
    rule = partial(decide, oldest_arrival=0.0, last_arrival=0.0, batch_size=4, max_delay=0.1)
    assert not rule(now=0.0, queued=0, arrival_rate=0.0).dispatch
    assert rule(now=0.0, queued=1, arrival_rate=0.0).dispatch
    assert rule(now=0.0, queued=4, arrival_rate=1e6).dispatch
    assert rule(now=0.0, queued=1, arrival_rate=5.0).dispatch  # < 1 arrival expected
    waiting = rule(now=0.0, queued=1, arrival_rate=100.0)
    assert not waiting.dispatch and waiting.wake_at == pytest.approx(0.03)  # 3 gaps of 10 ms
    assert rule(now=0.1, queued=1, arrival_rate=1e6).dispatch


def test_arrival_rate_evidence_decays_with_time() -> None:
    rate = WaitingArrivalRate(half_life=1.0)
    for step in range(1, 11):
        rate.advance(step * 0.01, queue_was_waiting=True)
        rate.record_arrival(joined_waiting_queue=True)
    busy = rate.per_second()
    rate.advance(10.0, queue_was_waiting=False)  # ten half-lives of an idle, empty queue
    rate.advance(10.001, queue_was_waiting=True)
    assert rate.per_second() < busy / 2
