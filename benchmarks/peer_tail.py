"""The tail at given offered loads, server against server, in paired rounds.

    python benchmarks/peer_tail.py          # about 35 minutes here

The peer benchmark (``batching_peers.py``) runs each rate once for 15 s: its p99 is the
fourth-slowest of ~400 requests, and ``policy_simulation.md`` shows how far such a p99
moves on the arrivals alone. This script asks the narrower question again with more
evidence: the servers named (default Ferry ``adaptive`` and Triton, the same ResNet-18
pipeline, batch 8, 50 ms delay, 480x480 JPEGs as there) all start once and stay up; each
round sends every server, in alternating order, the same seeded Poisson trace at each
rate (a new seed per round). Per rate: each round's p50/p99 per server, the median over
rounds, and in how many rounds each server had the lower p99.

Beside them, the ideal dispatcher of the limit report (``ferry_bench.limit.simulate``) on
the same arrivals, with this run's own costs: the pipeline profiled the way ``ferry bench
limit`` profiles it, plus the no-op round trip of a Ferry server, both measured first. The
rates are fractions of the X* that profile gives (``--fractions``), so a run on a faster or
slower machine offers the same share of its capacity; ``--rates`` fixes them instead. Triton needs
``scripts/triton-venv.sh`` (TorchServe, ``--servers 'ferry adaptive,torchserve'``,
``scripts/torchserve-venv.sh``). A Ferry server named with ``pinned`` after its policy
(``'ferry adaptive,ferry adaptive pinned'``) runs with ``cpu_pinning``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.batching_peers import (
    BATCH,
    DELAY_MS,
    FRACTIONS,
    PINNED,
    POLICIES,
    SERVERS,
    Target,
    Workload,
    prepare,
    serving,
)
from benchmarks.common import machine_description, publish
from ferry_bench.limit import Bounds, bounds, cost_function, simulate
from ferry_bench.limit_run import LimitSpec, profile_costs, round_trip
from ferry_bench.load import LoadResult, LoadSpec, run_load

RESULTS = Path(__file__).resolve().parent / "results"
IDEAL = "ideal"

Row = tuple[float, float, int]
"""One round's p50 ms, p99 ms and failed requests."""


@dataclass
class Limit:
    """This run's profile, as the ideal dispatcher sees it."""

    costs: dict[int, dict[str, float]]
    round_trip_ms: float
    bounds: Bounds

    def ideal(self, arrivals_s: list[float]) -> Row:
        simulated = simulate(arrivals_s, cost_function(self.costs), BATCH, 1, self.round_trip_ms)
        return simulated.latency_ms(50), simulated.latency_ms(99), 0


def measure_limit(work: Workload, folder: Path, profile_seconds: float) -> Limit:
    """The pipeline's cost per batch size and Ferry's no-op round trip, as ``ferry bench
    limit`` measures them (before any server of the comparison starts)."""
    spec = LimitSpec(
        model=work.archive,
        inputs=work.jpegs,
        slo_ms=1000.0,
        batch_size=BATCH,
        max_batch_delay=DELAY_MS,
        workers=1,
        fractions=[],
        seconds=0.0,
        profile_seconds=profile_seconds,
        content_type="image/jpeg",
    )
    say = functools.partial(print, flush=True)
    costs = profile_costs(spec, folder, say)
    trip, _ = round_trip(spec, folder, say)
    return Limit(costs, trip, bounds(costs, trip, spec.slo_ms))


def load(target: Target, spec: LoadSpec) -> LoadResult:
    return asyncio.run(run_load(spec))


def spec_for(target: Target, **shape: Any) -> LoadSpec:
    payloads = [path.read_bytes() for path in target.inputs]
    return LoadSpec(target.url, payloads, content_type=target.content_type, **shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="ferry adaptive,triton")
    parser.add_argument(
        "--fractions", default=FRACTIONS, help="offered loads as fractions of X*, comma-separated"
    )
    parser.add_argument("--rates", help="requests/s, comma-separated (instead of --fractions)")
    parser.add_argument("--profile-seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "peer_tail.md")
    args = parser.parse_args()
    servers = [name.strip() for name in args.servers.split(",")]
    known = (*SERVERS, *(f"ferry {policy}{PINNED}" for policy in POLICIES))
    unknown = [name for name in servers if name not in known]
    if unknown:
        parser.error(f"unknown server {unknown[0]!r}; one of {', '.join(known)}")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = prepare(Path(tmp))
        limit = measure_limit(work, Path(tmp) / "limit", args.profile_seconds)
        if args.rates:
            rates = [float(rate) for rate in args.rates.split(",")]
        else:
            ceiling = limit.bounds.ceiling_sequential
            rates = [round(float(f) * ceiling, 1) for f in args.fractions.split(",")]
        # figures[rate][server]: one row per round; the ideal's under IDEAL
        figures: dict[float, dict[str, list[Row]]] = {
            rate: {name: [] for name in [*servers, IDEAL]} for rate in rates
        }
        targets = {
            name: stack.enter_context(serving(name, work, Path(tmp) / name.replace(" ", "_")))
            for name in servers
        }
        for target in targets.values():  # warm-up: every batch size seen once
            load(target, spec_for(target, concurrency=16, requests=64))
        for round_index in range(args.rounds):
            order = servers if round_index % 2 == 0 else servers[::-1]
            for rate in rates:
                for name in order:
                    shape = {"rate": rate, "duration": args.seconds, "seed": round_index}
                    result = load(targets[name], spec_for(targets[name], **shape))
                    row = (result.latency_ms(50), result.latency_ms(99), result.failed)
                    figures[rate][name].append(row)
                    print(f"round {round_index} {rate} {name}: {row}", flush=True)
                    if name == order[0]:  # every server gets this trace: one ideal per round
                        figures[rate][IDEAL].append(limit.ideal(result.arrivals_s))
    publish(args.out, report(args, servers, rates, figures, limit))


def report(
    args: argparse.Namespace,
    servers: list[str],
    rates: list[float],
    figures: dict[float, dict[str, list[Row]]],
    limit: Limit,
) -> list[str]:
    shape = f"--rates {args.rates}" if args.rates else f"--fractions {args.fractions}"
    ceiling = limit.bounds.ceiling_sequential
    costs = ", ".join(
        f"{size}: {sum(stages.values()):.1f}" for size, stages in sorted(limit.costs.items())
    )
    lines = [
        "# The tail at one load, server against server, in paired rounds",
        "",
        f"Machine: {machine_description()}; servers and load generator share its cores.",
        f"Command: `python benchmarks/peer_tail.py --servers '{args.servers}' {shape} "
        f"--rounds {args.rounds} --seconds {args.seconds:g} --profile-seconds "
        f"{args.profile_seconds:g}`. The peer "
        "benchmark's workload (ResNet-18 behind the same PIL + torch pipeline, one worker or "
        "instance, batch 8, 50 ms delay, 480x480 JPEGs); every server up for the whole run; "
        f"each round sends each server the same seeded Poisson trace ({args.seconds:g} s, a "
        "new seed per round), servers in alternating order.",
        "",
        "The ideal dispatcher (never idle while requests wait, never waits to fill a batch, no "
        "overhead but the round trip) gets the same traces, costed by this run's profile: "
        f"batch size: ms {costs}; Ferry's no-op round trip {limit.round_trip_ms:.2f} ms; "
        f"X* {ceiling:.1f} req/s, L0 {limit.bounds.floor_ms:.1f} ms.",
        "",
        "## Medians over rounds",
        "",
        "| req/s | of X* | "
        + " | ".join(f"{name} p99 ms" for name in [*servers, IDEAL])
        + " | "
        + " | ".join(f"{name} p99 / ideal" for name in servers)
        + " | lowest p99 in rounds |",
        "|---|---|" + "---|" * (2 * len(servers) + 2),
    ]
    for rate in rates:
        p99 = {name: _median_p99(figures[rate][name]) for name in [*servers, IDEAL]}
        wins = _wins(servers, figures[rate], args.rounds)
        lines.append(
            f"| {rate:g} | {rate / ceiling:.0%} | "
            + " | ".join(f"{p99[name]:.1f}" for name in [*servers, IDEAL])
            + " | "
            + " | ".join(f"{p99[name] / p99[IDEAL]:.2f}" for name in servers)
            + " | "
            + ", ".join(f"{name} {wins[name]}" for name in servers)
            + " |"
        )
    lines.append("")
    for rate in rates:
        lines += [
            f"## {rate:g} req/s ({rate / ceiling:.0%} of X*)",
            "",
            "| round | " + " | ".join(f"{name} p50 / p99 ms" for name in [*servers, IDEAL]) + " |",
            "|---|" + "---|" * (len(servers) + 1),
        ]
        for index in range(args.rounds):
            cells = [_cell(figures[rate][name][index]) for name in [*servers, IDEAL]]
            lines.append(f"| {index + 1} | " + " | ".join(cells) + " |")
        medians = []
        for name in [*servers, IDEAL]:
            rows = figures[rate][name]
            p50 = statistics.median(row[0] for row in rows)
            medians.append(f"**{p50:.1f} / {_median_p99(rows):.1f}**")
        lines.append("| median | " + " | ".join(medians) + " |")
        wins = _wins(servers, figures[rate], args.rounds)
        lines += [
            "",
            "Lowest p99 in "
            + ", ".join(f"{wins[name]} of {args.rounds} rounds: {name}" for name in servers)
            + ".",
            "",
        ]
    return lines


def _median_p99(rows: list[Row]) -> float:
    return statistics.median(row[1] for row in rows)


def _wins(servers: list[str], rows: dict[str, list[Row]], rounds: int) -> dict[str, int]:
    """In how many rounds each server had the lowest p99 (among the servers, not the ideal)."""
    wins = {name: 0 for name in servers}
    for index in range(rounds):
        wins[min(servers, key=lambda name: rows[name][index][1])] += 1
    return wins


def _cell(row: Row) -> str:
    p50, p99, errors = row
    return f"{p50:.1f} / {p99:.1f}" + (f" ({errors} errors)" if errors else "")


if __name__ == "__main__":
    main()
