"""Accepted throughput under a flood of 503s: does rejecting excess work stay cheap enough
that the work accepted still runs near the model's capacity?

    python benchmarks/overload_benchmark.py --out benchmarks/results/overload.md

One server; a model that burns ~100 ms of CPU per request (batch 1, one worker, so about
10 req/s on its core) behind a queue of 4. Each round measures the capacity (concurrency
2, nothing rejected) and then floods it with closed loops of 16, 64 and 256 clients that
resend at once after each 503. Reported: accepted (200) requests per second under each
flood against the capacity of the same round, medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_description, publish
from benchmarks.server import ferry_server
from ferry.store.writer import ArchiveSpec, write_archive
from ferry_bench.load import LoadResult, LoadSpec, run_load

BURN_SECONDS = 0.1
FLOODS = (16, 64, 256)
QUEUE = 4

BURNER = f"""
import time


def handle(data, context):
    if data is None:
        return None
    deadline = time.process_time() + {BURN_SECONDS} * len(data)
    while time.process_time() < deadline:  # CPU, not sleep: rejections compete with it
        pass
    return ["ok"] * len(data)
"""


def burner_archive(store: Path) -> str:
    folder = store / ".burner-src"
    folder.mkdir(parents=True, exist_ok=True)
    handler = folder / "burner.py"
    handler.write_text(BURNER)
    config = folder / "model-config.yaml"
    config.write_text(yaml.safe_dump({"minWorkers": 1, "batchSize": 1, "maxBatchDelay": 0}))
    return write_archive(ArchiveSpec("burner", str(handler), config_file=config), store).name


def flood(url: str, concurrency: int, seconds: float) -> LoadResult:
    spec = LoadSpec(url, [b"x"], concurrency=concurrency, duration=seconds)
    return asyncio.run(run_load(spec))


def accepted_per_second(result: LoadResult) -> float:
    return result.statuses.get(200, 0) / result.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/overload.md"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ferry-overload-bench-"))
    store = tmp / "store"
    store.mkdir()
    archive = burner_archive(store)
    capacity: list[float] = []
    accepted: dict[int, list[float]] = {c: [] for c in FLOODS}
    rejected: dict[int, list[float]] = {c: [] for c in FLOODS}
    flags = ("--job-queue-size", str(QUEUE))
    with ferry_server(store, [f"burner={archive}"], tmp, *flags) as server:
        url = f"{server.url}/predictions/burner"
        flood(url, 2, 2.0)  # warm-up
        for index in range(args.rounds):
            baseline = flood(url, 2, args.seconds)
            if set(baseline.statuses) != {200}:
                raise RuntimeError(f"capacity run was not clean: {dict(baseline.statuses)}")
            capacity.append(accepted_per_second(baseline))
            for clients in FLOODS:
                result = flood(url, clients, args.seconds)
                accepted[clients].append(accepted_per_second(result))
                rejected[clients].append(result.statuses.get(503, 0) / result.seconds)
            print(
                f"round {index + 1}: capacity {capacity[-1]:.1f}, "
                + ", ".join(f"c={c} {accepted[c][-1]:.1f}" for c in FLOODS),
                flush=True,
            )
    med = statistics.median
    lines = [
        "# Accepted throughput under a flood of 503s",
        "",
        f"Machine: {machine_description()}.",
        f"One server, produced by `benchmarks/overload_benchmark.py` in one run: a model "
        f"burning {BURN_SECONDS * 1000:.0f} ms of CPU per request (batch 1, one worker), "
        f"`--job-queue-size {QUEUE}`. Each of {args.rounds} rounds measures the capacity "
        f"(concurrency 2, {args.seconds:g} s, no rejections) and then closed-loop floods of "
        f"{', '.join(map(str, FLOODS))} clients for {args.seconds:g} s each; a flooding client "
        "resends as soon as it gets its 503. The load generator runs on the same 2 cores.",
        "",
        "| clients | accepted req/s (median) | 503s per second (median) | "
        "accepted / capacity (median of per-round ratios) |",
        "|---|---|---|---|",
        f"| 2 (capacity) | {med(capacity):.1f} | 0 | 1.00 |",
    ]
    for clients in FLOODS:
        ratios = [a / c for a, c in zip(accepted[clients], capacity, strict=True)]
        lines.append(
            f"| {clients} | {med(accepted[clients]):.1f} | {med(rejected[clients]):.0f} | "
            f"{med(ratios):.2f} |"
        )
    lines += [
        "",
        "Rounds (capacity; accepted at each flood): "
        + "; ".join(
            f"{capacity[i]:.1f}; " + ", ".join(f"{accepted[c][i]:.1f}" for c in FLOODS)
            for i in range(args.rounds)
        )
        + ".",
        "",
    ]
    publish(args.out, lines)


if __name__ == "__main__":
    main()
