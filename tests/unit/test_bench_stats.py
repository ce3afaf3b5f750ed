"""Load-test statistics on synthetic data: percentiles, arrivals, server histograms."""

from __future__ import annotations

import math
import random
import statistics
from itertools import islice, pairwise

import pytest

from ferry.metrics.definitions import FerryMetrics
from ferry_bench.arrivals import poisson_offsets
from ferry_bench.server_stats import histogram_delta, parse_exposition, server_figures
from ferry_bench.stats import percentile


def test_percentiles_interpolate_like_numpy() -> None:
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 0) == 1 and percentile(values, 100) == 100
    assert percentile([7.0], 90) == 7.0
    assert math.isnan(percentile([], 50))


def test_poisson_arrivals_have_the_right_rate_and_exponential_gaps() -> None:
    offsets = list(islice(poisson_offsets(200.0, random.Random(7)), 20_000))
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(1 / 200, rel=0.03)
    # Exponential: standard deviation equals the mean, and P(gap > mean) = 1/e.
    assert statistics.stdev(gaps) == pytest.approx(1 / 200, rel=0.05)
    assert sum(g > 1 / 200 for g in gaps) / len(gaps) == pytest.approx(math.exp(-1), abs=0.02)
    assert all(b > a for a, b in pairwise(offsets))
    with pytest.raises(ValueError):
        next(poisson_offsets(0, random.Random()))


def _exposition(waits: list[float], batches: list[int]) -> str:
    metrics = FerryMetrics(hostname="h")
    model = metrics.for_model("m", "1.0")
    for size in batches:
        model.dispatched(waits[:size], size)
    return metrics.exposition()


def test_histogram_quantiles_from_scrape_deltas() -> None:
    before = parse_exposition(_exposition([0.002] * 8, [8]))
    after = parse_exposition(_exposition([0.002] * 8, [8, 8, 8, 8, 1]))
    delta = histogram_delta(before, after, "ferry_batch_size", model_name="m")
    assert delta.count == 4 and delta.total == 25  # (8 + 8 + 8 + 1) minus the first 8
    assert delta.quantile(0.5) == pytest.approx(4 + 4 / 3)  # rank 2 of 4: a third into (4, 8]
    figures = server_figures(before, after, "m")
    assert figures["batches"] == 4 and figures["mean_batch_size"] == 6.25
    distribution = figures["batch_size_distribution"]
    assert isinstance(distribution, dict)
    assert distribution["<=1"] == 1 and distribution["<=8"] == 3
    queue = figures["queue_ms"]
    assert isinstance(queue, dict) and 1.0 <= queue["p50"] <= 2.5


def test_server_percentiles_from_buckets_stay_near_the_exact_ones() -> None:
    rng = random.Random(4)
    # A narrow spread, as queue times often are: median 18 ms, p99 ~37 ms. Prometheus'
    # 1-2.5-5 buckets put p90 and p99 25-30% too high here.
    waits = [rng.lognormvariate(-4, 0.3) for _ in range(5000)]
    metrics = FerryMetrics(hostname="h")
    model = metrics.for_model("m", "1.0")
    for start in range(0, len(waits), 8):
        model.dispatched(waits[start : start + 8], len(waits[start : start + 8]))
    before = parse_exposition(FerryMetrics(hostname="h").exposition())
    after = parse_exposition(metrics.exposition())
    delta = histogram_delta(before, after, "ferry_queue_wait_seconds", model_name="m")
    for q in (50, 90, 99):
        exact = percentile(waits, q)
        assert delta.quantile(q / 100) == pytest.approx(exact, rel=0.2)
