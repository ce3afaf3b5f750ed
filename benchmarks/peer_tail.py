"""The tail at given offered loads, server against server, in paired rounds.

    python benchmarks/peer_tail.py          # about 30 minutes here

The peer benchmark (``batching_peers.py``) runs each rate once for 15 s: its p99 is the
fourth-slowest of ~400 requests, and ``policy_simulation.md`` shows how far such a p99
moves on the arrivals alone. This script asks the narrower question again with more
evidence: the servers named (default Ferry ``adaptive`` and Triton, the same ResNet-18
pipeline, batch 8, 50 ms delay, 480x480 JPEGs as there) all start once and stay up; each
round sends every server, in alternating order, the same seeded Poisson trace at each
rate (a new seed per round). Per rate: each round's p50/p99 per server, the median over
rounds, and in how many rounds each server had the lower p99. Triton needs
``scripts/triton-venv.sh`` (TorchServe, ``--servers 'ferry adaptive,torchserve'``,
``scripts/torchserve-venv.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.batching_peers import SERVERS, Target, prepare, serving
from benchmarks.common import machine_description, publish
from ferry.bench.load import LoadResult, LoadSpec, run_load

RESULTS = Path(__file__).resolve().parent / "results"
PEER_RATES = "3.9,11.6,19.3,27.1,30.9,34.8,36.7"
"""The rates of the committed peer benchmark's sweep (10% to 95% of its X*)."""


def load(target: Target, spec: LoadSpec) -> LoadResult:
    return asyncio.run(run_load(spec))


def spec_for(target: Target, **shape: Any) -> LoadSpec:
    payloads = [path.read_bytes() for path in target.inputs]
    return LoadSpec(target.url, payloads, content_type=target.content_type, **shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="ferry adaptive,triton")
    parser.add_argument("--rates", default=PEER_RATES, help="requests/s, comma-separated")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "peer_tail.md")
    args = parser.parse_args()
    servers = [name.strip() for name in args.servers.split(",")]
    unknown = [name for name in servers if name not in SERVERS]
    if unknown:
        parser.error(f"unknown server {unknown[0]!r}; one of {', '.join(SERVERS)}")
    rates = [float(rate) for rate in args.rates.split(",")]
    # figures[rate][server]: one (p50, p99, errors) per round
    figures: dict[float, dict[str, list[tuple[float, float, int]]]] = {
        rate: {name: [] for name in servers} for rate in rates
    }
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = prepare(Path(tmp))
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
    publish(args.out, report(args, servers, rates, figures))


def report(
    args: argparse.Namespace,
    servers: list[str],
    rates: list[float],
    figures: dict[float, dict[str, list[tuple[float, float, int]]]],
) -> list[str]:
    lines = [
        "# The tail at one load, server against server, in paired rounds",
        "",
        f"Machine: {machine_description()}; servers and load generator share its cores.",
        f"Command: `python benchmarks/peer_tail.py --servers '{args.servers}' --rates "
        f"{args.rates} --rounds {args.rounds} --seconds {args.seconds:g}`. The peer "
        "benchmark's workload (ResNet-18 behind the same PIL + torch pipeline, one worker or "
        "instance, batch 8, 50 ms delay, 480x480 JPEGs); every server up for the whole run; "
        f"each round sends each server the same seeded Poisson trace ({args.seconds:g} s, a "
        "new seed per round), servers in alternating order.",
        "",
    ]
    for rate in rates:
        lines += [
            f"## {rate:g} req/s",
            "",
            "| round | " + " | ".join(f"{name} p50 / p99 ms" for name in servers) + " |",
            "|---|" + "---|" * len(servers),
        ]
        for index in range(args.rounds):
            cells = [_cell(figures[rate][name][index]) for name in servers]
            lines.append(f"| {index + 1} | " + " | ".join(cells) + " |")
        medians = []
        for name in servers:
            rows = figures[rate][name]
            p50 = statistics.median(row[0] for row in rows)
            p99 = statistics.median(row[1] for row in rows)
            medians.append(f"**{p50:.1f} / {p99:.1f}**")
        lines.append("| median | " + " | ".join(medians) + " |")
        wins = {name: 0 for name in servers}
        for index in range(args.rounds):
            best = min(servers, key=lambda name: figures[rate][name][index][1])
            wins[best] += 1
        lines += [
            "",
            "Lowest p99 in "
            + ", ".join(f"{wins[name]} of {args.rounds} rounds: {name}" for name in servers)
            + ".",
            "",
        ]
    return lines


def _cell(row: tuple[float, float, int]) -> str:
    p50, p99, errors = row
    return f"{p50:.1f} / {p99:.1f}" + (f" ({errors} errors)" if errors else "")


if __name__ == "__main__":
    main()
