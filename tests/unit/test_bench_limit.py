"""The limit's arithmetic and the ideal dispatcher, on cases solved by hand; the open
loop's arrival shapes."""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from itertools import islice, pairwise

import pytest

from ferry_bench.arrivals import bursty_offsets, poisson_offsets, step_of, step_offsets
from ferry_bench.limit import bounds, cost_function, simulate
from ferry_bench.limit_run import batch_sizes_up_to
from ferry_bench.load import LoadSpec, run_load
from ferry_bench.load_report import load_summary
from ferry_bench.target_types import Answer


def test_periodic_arrivals_slower_than_service_are_never_queued() -> None:
    arrivals = [i * 0.02 for i in range(50)]  # every 20 ms; a batch of one takes 5 ms
    result = simulate(arrivals, {1: 5.0, 2: 6.0, 4: 8.0}, max_batch=4, round_trip_ms=1.0)
    assert result.batch_sizes == [1] * 50
    assert result.latencies_ms == pytest.approx([6.0] * 50)


def test_a_burst_is_served_in_full_batches_oldest_first() -> None:
    cost = {1: 10.0, 2: 12.0, 3: 14.0, 4: 16.0}
    result = simulate([0.0] * 10, cost, max_batch=4)
    assert result.batch_sizes == [4, 4, 2]  # done at 16, 32, 44 ms
    assert result.latencies_ms == pytest.approx([16.0] * 4 + [32.0] * 4 + [44.0] * 2)


def test_workers_serve_in_parallel_and_arrivals_join_the_next_batch() -> None:
    cost = {1: 10.0, 2: 12.0}
    two = simulate([0.0, 0.0], cost, max_batch=1, workers=2)
    assert two.latencies_ms == pytest.approx([10.0, 10.0])
    # One worker: the first request starts alone at 0; two more arrive during it and
    # leave together in the next batch (done at 10 + 12 = 22 ms).
    late = simulate([0.0, 0.002, 0.004], cost, max_batch=2)
    assert late.batch_sizes == [1, 2]
    assert late.latencies_ms == pytest.approx([10.0, 20.0, 18.0])


def test_md1_queue_matches_pollaczek_khinchine() -> None:
    # Poisson arrivals at 50/s, one at a time, 10 ms each: rho = 0.5, and the M/D/1 mean
    # wait is rho * D / (2 * (1 - rho)) = 5 ms, so the mean latency is 15 ms.
    arrivals = list(islice(poisson_offsets(50.0, random.Random(11)), 200_000))
    result = simulate(arrivals, {1: 10.0}, max_batch=1)
    assert statistics.mean(result.latencies_ms) == pytest.approx(15.0, rel=0.03)


def test_bounds_from_stage_costs() -> None:
    costs = {
        1: {"pre": 2.0, "model": 3.0},
        2: {"pre": 3.0, "model": 4.0},
        4: {"pre": 4.0, "model": 8.0},
    }
    limits = bounds(costs, round_trip_ms=1.0, slo_ms=20.0)
    assert limits.floor_ms == 6.0  # cost(1) + r
    assert limits.best_batch == 4 and limits.ceiling_sequential == pytest.approx(4000 / 12)
    assert limits.ceiling_pipelined == pytest.approx(500.0)  # 4 items per 8 ms stage
    # 2 x cost(b) <= 20 ms admits batches 1 (5 ms) and 2 (7 ms): 2 per 7 ms is best.
    assert limits.slo_batch == 2 and limits.slo_capacity == pytest.approx(2000 / 7)
    doubled = bounds(costs, 1.0, 20.0, workers=2)
    assert doubled.ceiling_sequential == pytest.approx(2 * limits.ceiling_sequential)
    assert bounds(costs, 1.0, slo_ms=9.0).slo_capacity is None  # 2 x 5 ms > 9 ms
    with pytest.raises(ValueError, match="batch size 1"):
        bounds({2: {"x": 1.0}}, 0.0, 10.0)


def test_unprofiled_sizes_cost_the_next_size_up() -> None:
    table = cost_function({1: {"x": 2.0}, 4: {"x": 5.0}})
    assert table == {1: 2.0, 2: 5.0, 3: 5.0, 4: 5.0}
    assert batch_sizes_up_to(8) == [1, 2, 4, 8] and batch_sizes_up_to(12) == [1, 2, 4, 8, 12]


def test_bursts_are_silent_between_and_keep_the_mean() -> None:
    offsets = list(islice(bursty_offsets(400.0, 0.5, 1.5, random.Random(3)), 40_000))
    assert all(offset % 2.0 < 0.5 for offset in offsets)  # nothing while off
    assert all(b >= a for a, b in pairwise(offsets))
    assert len(offsets) / offsets[-1] == pytest.approx(400 * 0.5 / 2.0, rel=0.03)


def test_steps_change_the_rate_and_end() -> None:
    steps = ((100.0, 20.0), (400.0, 20.0), (50.0, 20.0))
    offsets = list(step_offsets(steps, random.Random(5)))
    assert offsets[-1] < 60.0
    counts = [sum(1 for o in offsets if step_of(o, steps) == i) for i in range(3)]
    for count, (rate, seconds) in zip(counts, steps, strict=True):
        assert count == pytest.approx(rate * seconds, rel=0.1)
    assert step_of(0.0, steps) == 0 and step_of(20.0, steps) == 1 and step_of(99.0, steps) == 2


class Ok:
    protocol = "fake"

    async def send(self, index: int) -> Answer:
        return Answer(200, b"")

    async def close(self) -> None:
        pass


def test_a_step_load_is_reported_per_step() -> None:
    spec = LoadSpec("http://h:1/predictions/m", [b"x"], steps=((2000.0, 0.05), (4000.0, 0.05)))
    summary = load_summary(spec, asyncio.run(run_load(spec, target=Ok())))
    assert summary["traffic"] == "Poisson in steps: 2000/s for 0.05 s, 4000/s for 0.05 s"
    first, second = summary["steps"]
    assert first["sent"] + second["sent"] == summary["requests_sent"]
    assert first["sent"] == first["succeeded"] and second["sent"] > first["sent"]


def _arguments(**given: object) -> argparse.Namespace:
    defaults: dict[str, object] = {
        "url": "http://h:1/predictions/m",
        "concurrency": None,
        "rate": None,
        "steps": None,
        "bursts": None,
        "requests": None,
        "duration": 1.0,
        "max_error_rate": 0.0,
        "content_type": "application/octet-stream",
        "seed": 0,
        "token": None,
    }
    return argparse.Namespace(**(defaults | given))


def test_load_arguments_make_one_spec_per_rate() -> None:
    from ferry_bench.commands.load import load_specs

    specs = load_specs(_arguments(rate="50,100", bursts="1,2"), [b"x"])
    assert [s.rate for s in specs] == [50.0, 100.0] and specs[0].bursts == (1.0, 2.0)
    stepped = load_specs(_arguments(steps="10:1,20:2", duration=None), [b"x"])
    assert stepped[0].steps == ((10.0, 1.0), (20.0, 2.0))
    for given, words in (
        ({"rate": "50,x"}, "comma-separated numbers"),
        ({"rate": "0"}, "positive"),
        ({"concurrency": 4, "bursts": "1,1"}, "give --rate too"),
        ({"rate": "5", "bursts": "1"}, "ON,OFF"),
        ({"steps": "10-1"}, "RATE:SECONDS"),
        ({"concurrency": 4, "duration": None}, "--requests or --duration"),
    ):
        with pytest.raises(ValueError, match=words):
            load_specs(_arguments(**given), [b"x"])
