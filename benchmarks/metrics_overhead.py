"""What observability costs: a no-op model at concurrency 16 on three servers side by side,
the defaults (metrics and access log on), metrics off, and access log off.

    python benchmarks/metrics_overhead.py --out benchmarks/results/metrics_overhead.md

Rounds rotate the order of the servers; medians of the per-round throughput ratios
against the defaults are reported, with the in-process cost of the metric bookkeeping.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import closed_loop, machine_description, noop_archive, publish
from benchmarks.server import ferry_server
from ferry.metrics.definitions import FerryMetrics


def throughput(url: str, requests: int) -> float:
    return closed_loop(url, [b"x"], 16, requests).throughput


def bookkeeping_microseconds(requests: int = 200_000, batch: int = 8) -> float:
    """In-process cost per request of what the frontend records (no I/O, no noise from
    the other processes): request counters and histograms, the per-batch share, the
    response counter."""
    metrics = FerryMetrics(hostname="bench")
    model = metrics.for_model("noop", "1.0")
    record = metrics.response_recorder("inference")
    waits = [0.001] * batch
    start = time.perf_counter()
    for index in range(requests):
        model.request_done(0.002, 0.0005)
        record(200)
        if index % batch == 0:
            model.dispatched(waits, batch)
            model.stages({"handle": 0.3})
    return (time.perf_counter() - start) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/metrics_overhead.md"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=6000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ferry-metrics-bench-"))
    store = tmp / "store"
    archive = noop_archive(store, batch_size=8)
    variants = {
        "defaults (metrics on, access log on)": [],
        "metrics off (`--enable-metrics-api false`)": ["--enable-metrics-api", "false"],
        "access log off (`--access-log false`)": ["--access-log", "false"],
    }
    rps: dict[str, list[float]] = {name: [] for name in variants}
    with contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(ferry_server(store, [f"noop={archive}"], tmp, *flags))
            for name, flags in variants.items()
        }
        for server in servers.values():
            throughput(f"{server.url}/predictions/noop", 1000)  # warm-up
        names = list(servers)
        for index in range(args.rounds):
            order = names[index % 3 :] + names[: index % 3]
            for name in order:
                rps[name].append(throughput(f"{servers[name].url}/predictions/noop", args.requests))
            print(
                f"round {index + 1}: " + ", ".join(f"{rps[n][-1]:.0f}" for n in names), flush=True
            )
    med = statistics.median
    per_request_us = bookkeeping_microseconds()
    base = names[0]
    lines = [
        "# Cost of observability: no-op handler, concurrency 16",
        "",
        f"Machine: {machine_description()}.",
        f"{args.rounds} rounds of {args.requests} requests to each of three servers, order "
        "rotating; produced by `benchmarks/metrics_overhead.py` in one run. A no-op model is "
        "the worst case: a real model spends far longer per request than the bookkeeping does.",
        "",
        "| server | median req/s | median per-round ratio to the defaults |",
        "|---|---|---|",
    ]
    for name in names:
        ratios = [a / b for a, b in zip(rps[name], rps[base], strict=True)]
        lines.append(f"| {name} | {med(rps[name]):.0f} | {med(ratios):.3f} |")
    lines += [
        "",
        "Rounds (req/s, same order as the table): "
        + "; ".join(", ".join(f"{rps[n][i]:.0f}" for n in names) for i in range(args.rounds))
        + ". The spread is the shared machine's noise; the in-process figure below has none.",
        "",
        f"Metric bookkeeping measured in process: **{per_request_us:.2f} µs per request** "
        "(request counters and histograms, the per-batch share at batch 8, the response "
        "counter).",
        "",
    ]
    publish(args.out, lines)


if __name__ == "__main__":
    main()
