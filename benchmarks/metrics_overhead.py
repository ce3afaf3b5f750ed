"""What collecting metrics costs: a no-op model at concurrency 16, metrics on against off.

    python benchmarks/metrics_overhead.py --out benchmarks/results/metrics_overhead.md

Two servers (``enable_metrics_api`` true and false) run side by side; rounds alternate
between them and the median of the per-round throughput ratios is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_description, noop_archive
from ferry.bench.load import run_closed_loop
from ferry.metrics.definitions import FerryMetrics
from tests.fixtures.server import ferry_server


def throughput(url: str, requests: int) -> float:
    result = asyncio.run(run_closed_loop(url, [b"x"], concurrency=16, requests=requests))
    if set(result.statuses) != {200}:
        raise RuntimeError(f"errors during the benchmark: {dict(result.statuses)}")
    return result.throughput


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
    on_rps, off_rps, ratios = [], [], []
    with (
        ferry_server(store, [f"noop={archive}"], tmp) as on,
        ferry_server(store, [f"noop={archive}"], tmp, "--enable-metrics-api", "false") as off,
    ):
        for url in (on.url, off.url):
            throughput(f"{url}/predictions/noop", 1000)  # warm-up
        for index in range(args.rounds):
            order = [(on, on_rps), (off, off_rps)]
            for server, figures in order if index % 2 == 0 else reversed(order):
                figures.append(throughput(f"{server.url}/predictions/noop", args.requests))
            ratios.append(on_rps[-1] / off_rps[-1])
            print(
                f"round {index + 1}: on {on_rps[-1]:.0f} req/s, off {off_rps[-1]:.0f} req/s",
                flush=True,
            )
    med = statistics.median
    per_request_us = bookkeeping_microseconds()
    lines = [
        "# Cost of metrics collection: no-op handler, concurrency 16",
        "",
        f"Machine: {machine_description()}.",
        f"{args.rounds} rounds of {args.requests} requests to each of two servers (metrics on, "
        "metrics off), alternating; produced by `benchmarks/metrics_overhead.py` in one run.",
        "",
        "| metrics | median req/s |",
        "|---|---|",
        f"| on | {med(on_rps):.0f} |",
        f"| off (`--enable-metrics-api false`) | {med(off_rps):.0f} |",
        "",
        f"Median per-round throughput ratio on / off: **{med(ratios):.3f}** (1 = no cost; a "
        "no-op model is the worst case, a real model spends far longer per request than the "
        "bookkeeping does).",
        "",
        "Per-round ratios: " + ", ".join(f"{r:.3f}" for r in ratios) + ". The spread is "
        "the shared machine's noise; the in-process figure below has none.",
        "",
        f"Bookkeeping measured in process: **{per_request_us:.2f} µs per request** (request "
        "counters and histograms, the per-batch share at batch 8, the response counter), "
        f"i.e. {per_request_us * med(off_rps) / 1e4:.1f}% of one core at the no-op rate above.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
