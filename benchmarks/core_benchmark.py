"""Ferry core benchmark: ResNet-18 through the server against the same pipeline offline.

    python benchmarks/core_benchmark.py --out benchmarks/results/core.md

In one run, alternating rounds:
- offline: the image_classifier handler (JPEG decode, resize/crop, ResNet-18, top-5) in
  this process, no server, at batch sizes 1..16; the best throughput is the offline limit;
- server: the same archive behind ``ferry serve`` (1 worker, batch size = the offline
  best), throughput at concurrency 16 and p50 latency at concurrency 1;
- the server's own overhead: a no-op handler at concurrency 16.
Medians over rounds are reported, with the ratios the core issue targets.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    jpeg_inputs,
    machine_description,
    noop_archive,
    offline_handler,
    resnet18_archive,
    time_batches,
)
from ferry.bench.load import run_closed_loop
from tests.fixtures.server import ferry_server

BATCH_SIZES = (1, 2, 4, 8, 16)


def offline_round(handler, context, payloads: list[bytes], seconds: float) -> dict[int, float]:  # type: ignore[no-untyped-def]
    """Images per second at each batch size, and (key 0) batch-1 median latency in ms."""
    figures: dict[int, float] = {}
    for batch_size in BATCH_SIZES:
        timings = time_batches(lambda rows: handler(rows, context), payloads, batch_size, seconds)
        figures[batch_size] = batch_size / statistics.median(timings)
        if batch_size == 1:
            figures[0] = statistics.median(timings) * 1000
    return figures


def load(url: str, payloads: list[bytes], concurrency: int, requests: int):  # type: ignore[no-untyped-def]
    result = asyncio.run(
        run_closed_loop(
            url, payloads, concurrency=concurrency, requests=requests, content_type="image/jpeg"
        )
    )
    if set(result.statuses) != {200}:
        raise RuntimeError(f"errors during the benchmark: {dict(result.statuses)}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/core.md"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="offline time per batch size")
    parser.add_argument("--image-size", type=int, default=480)
    args = parser.parse_args()

    payloads = jpeg_inputs(64, args.image_size)
    tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    store = tmp / "store"
    probe_archive = resnet18_archive(store, batch_size=1, max_batch_delay_ms=10)
    handler, context = offline_handler(store, probe_archive, batch_size=16)
    print("warming up offline ...", flush=True)
    time_batches(lambda rows: handler(rows, context), payloads, 8, 3.0)
    first = offline_round(handler, context, payloads, args.seconds)
    best_batch = max(BATCH_SIZES, key=lambda b: first[b])
    print(f"offline best batch size: {best_batch} ({first[best_batch]:.1f} img/s)", flush=True)
    archive = resnet18_archive(store, batch_size=best_batch, max_batch_delay_ms=10)
    noop = noop_archive(store, batch_size=8)

    offline_rounds, server_tput, server_p50, noop_rps = [first], [], [], []
    models = [f"resnet18={archive}", f"noop={noop}"]
    with ferry_server(store, models, tmp) as server:
        resnet_url = f"{server.url}/predictions/resnet18"
        load(resnet_url, payloads, 16, 64)  # warm-up
        for round_index in range(args.rounds):
            if round_index:
                offline_rounds.append(offline_round(handler, context, payloads, args.seconds))
            requests = max(160, int(first[best_batch] * 12))
            result = load(resnet_url, payloads, 16, requests)
            server_tput.append(result.throughput)
            server_p50.append(load(resnet_url, payloads, 1, 60).latency_ms(50))
            noop_rps.append(load(f"{server.url}/predictions/noop", [b"x"], 16, 5000).throughput)
            print(
                f"round {round_index + 1}: server {server_tput[-1]:.1f} img/s, "
                f"c=1 p50 {server_p50[-1]:.1f} ms, no-op {noop_rps[-1]:.0f} req/s",
                flush=True,
            )

    report = render(args, offline_rounds, best_batch, server_tput, server_p50, noop_rps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)


def render(args, offline_rounds, best_batch, server_tput, server_p50, noop_rps) -> str:  # type: ignore[no-untyped-def]
    med = statistics.median
    offline_best = med([r[best_batch] for r in offline_rounds])
    offline_b1 = med([r[0] for r in offline_rounds])
    tput, p50 = med(server_tput), med(server_p50)
    lines = [
        "# Ferry core benchmark: ResNet-18, image_classifier, JPEG input, 1 worker",
        "",
        f"Machine: {machine_description()}.",
        f"Inputs: 64 JPEGs of {args.image_size}x{args.image_size} px; "
        "ResNet-18 with random weights, "
        "TorchScript; handler: built-in `image_classifier` (decode, resize 256, crop 224, top-5).",
        f"Rounds: {len(server_tput)}, offline and server alternating in one run; medians shown. "
        "Produced by `make bench` (`benchmarks/core_benchmark.py`).",
        "",
        "## Offline handler pipeline (no server), images/s by batch size",
        "",
        "| batch size | " + " | ".join(str(b) for b in BATCH_SIZES) + " |",
        "|---" * (len(BATCH_SIZES) + 1) + "|",
        "| images/s | "
        + " | ".join(f"{med([r[b] for r in offline_rounds]):.1f}" for b in BATCH_SIZES)
        + " |",
        "",
        "## Server against offline",
        "",
        "| figure | offline | server | ratio / difference | target |",
        "|---|---|---|---|---|",
        f"| throughput, server at concurrency 16 (batch size {best_batch}) vs offline best | "
        f"{offline_best:.1f} img/s | {tput:.1f} img/s | {tput / offline_best:.3f} x | >= 0.9 x |",
        f"| p50 latency, server at concurrency 1 vs offline batch 1 | {offline_b1:.1f} ms | "
        f"{p50:.1f} ms | +{p50 - offline_b1:.1f} ms | <= +3 ms |",
        f"| no-op handler at concurrency 16 (server overhead) | - | "
        f"{med(noop_rps):.0f} req/s | - | - |",
        "",
        "Per round (server): "
        + "; ".join(
            f"{t:.1f} img/s, p50 {p:.1f} ms, no-op {n:.0f} req/s"
            for t, p, n in zip(server_tput, server_p50, noop_rps, strict=True)
        )
        + ".",
        "",
        "The load generator (`ferry.bench.load`) shares the machine's cores with the server "
        "and its worker.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
