"""The batch policies alone: Ferry's three, and Triton's dynamic batcher modelled as
"wait for a full batch, at most the delay", on a simulated clock with a measured cost curve
and many seeded Poisson traces.

    python benchmarks/policy_simulation.py

A served benchmark runs each rate once, for 15 s: its p99 is the fourth-slowest of ~400
requests, and it mixes the policy with everything else a server costs. This script takes
the cost curve a real run profiled (``costs_ms`` of a ``ferry bench limit`` report) and
that run's offered rates, and runs every policy on the same ``--seeds`` traces of the same
length (no server, no noise but the arrivals'). Per policy and rate it reports the median
p50 and p99 over the traces and the p10-p90 range of the traces' p99: how far a single
run's p99 can move on the arrivals alone, and which policy would win on these costs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.common import publish
from ferry.batching.policies import BatchPolicy, CostModel
from ferry.batching.registry import make_policy
from ferry_bench.arrivals import poisson_offsets
from ferry_bench.policy_sim import FullBatchPolicy, simulate_policy
from ferry_bench.stats import percentile

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_REPORT = RESULTS / "batching_peers" / "ferry_adaptive" / "limit.json"
POLICIES: dict[str, Callable[[], BatchPolicy]] = {
    "adaptive": lambda: make_policy("adaptive"),
    "immediate": lambda: make_policy("immediate"),
    "fixed_window": lambda: make_policy("fixed_window"),
    "full batch (Triton-like)": FullBatchPolicy,
}


def trace(rate: float, seconds: float, seed: int) -> list[float]:
    arrivals: list[float] = []
    for offset in poisson_offsets(rate, random.Random(seed)):
        if offset > seconds:
            return arrivals
        arrivals.append(offset)
    raise AssertionError("unreachable: poisson_offsets never ends")


def interpolated_costs(report: dict[str, Any]) -> dict[int, float]:
    """ms per batch for every size up to the largest profiled, sizes in between
    interpolated as a worker's cost model learns them (``CostModel``). The limit report's
    ideal costs them as the next size up instead (an upper bound): a batch of 5 would cost
    a batch of 8 and look worse than it is, which would favour policies that wait."""
    model = CostModel()
    for size, stages in report["costs_ms"].items():
        model.observe(int(size), sum(stages.values()))
    largest = max(model.seconds)
    return {size: model.cost(size) or 0.0 for size in range(1, largest + 1)}


Figures = dict[str, list[tuple[float, float]]]
"""Per policy, each trace's (p50, p99) in ms."""


def run_rate(report: dict[str, Any], rate: float, seeds: int) -> Figures:
    """Every policy on ``seeds`` traces at ``rate``."""
    spec = report["spec"]
    cost_ms = interpolated_costs(report)
    batch = min(spec["batch_size"], max(cost_ms))
    delay_s = spec["max_batch_delay"] / 1000
    figures: Figures = {name: [] for name in POLICIES}
    for seed in range(seeds):
        arrivals = trace(rate, spec["seconds"], seed)
        for name, policy in POLICIES.items():
            result = simulate_policy(
                policy(), arrivals, cost_ms, batch, delay_s, report["round_trip_ms"]
            )
            figures[name].append((result.latency_ms(50), result.latency_ms(99)))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS / "policy_simulation.md")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    spec = report["spec"]
    costs = "; ".join(
        f"{size}: {sum(stages.values()):.1f}" for size, stages in report["costs_ms"].items()
    )
    lines = [
        "# The batch policies alone, on many traces",
        "",
        f"Command: `python benchmarks/policy_simulation.py --report "
        f"{args.report.resolve().relative_to(RESULTS.parent.parent)} --seeds {args.seeds}`. "
        "No server: each policy's own decisions on a simulated clock "
        "(`ferry_bench.policy_sim`), one worker, batch size "
        f"{spec['batch_size']}, delay {spec['max_batch_delay']} ms, the profiled cost per "
        f"batch (ms) {costs} (sizes in between interpolated, as a worker's cost model does), "
        "plus the measured "
        f"round trip {report['round_trip_ms']:.2f} ms. Per rate, {args.seeds} seeded Poisson "
        f"traces of {spec['seconds']:g} s, the served run's length; every policy sees the "
        "same traces.",
        "",
        "Median over traces of p50 / p99 (ms), and in brackets the p10-p90 range of the "
        "traces' p99:",
        "",
        "| offered req/s | " + " | ".join(POLICIES) + " |",
        "|---|" + "---|" * len(POLICIES),
    ]
    for point in report["points"]:
        rate = point["offered"]
        figures = run_rate(report, rate, args.seeds)
        cells = []
        for name in POLICIES:
            p50s = [p50 for p50, _ in figures[name]]
            p99s = sorted(p99 for _, p99 in figures[name])
            cells.append(
                f"{statistics.median(p50s):.1f} / {statistics.median(p99s):.1f} "
                f"[{percentile(p99s, 10):.0f}-{percentile(p99s, 90):.0f}]"
            )
        lines.append(f"| {rate:.1f} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    publish(args.out, lines)


if __name__ == "__main__":
    main()
