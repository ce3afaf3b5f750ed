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
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    closed_loop,
    jpeg_inputs,
    machine_description,
    noop_archive,
    offline_handler,
    publish,
    resnet18_archive,
    time_batches,
)
from benchmarks.server import ferry_server
from ferry.config.settings import available_cores, threads_per_worker
from ferry.wire.environment import worker_environment
from ferry.worker.torch_setup import configure_torch
from ferry_bench.load import LoadResult

BATCH_SIZES = (1, 2, 4, 8, 16)


def offline_sweep(handler, context, payloads: list[bytes], seconds: float) -> dict[int, float]:  # type: ignore[no-untyped-def]
    """Images per second at each batch size."""
    return {
        b: b
        / statistics.median(time_batches(lambda rows: handler(rows, context), payloads, b, seconds))
        for b in BATCH_SIZES
    }


def load(url: str, payloads: list[bytes], concurrency: int, requests: int) -> LoadResult:
    return closed_loop(url, payloads, concurrency, requests, "image/jpeg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/core.md"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of one measurement")
    parser.add_argument("--image-size", type=int, default=480)
    args = parser.parse_args()
    environment = worker_environment(os.environ)
    if any(os.environ.get(key) != value for key, value in environment.items()):
        # The offline side runs with the memory settings a worker gets, or it is no limit.
        os.execve(sys.executable, [sys.executable, *sys.argv], environment)
    configure_torch(threads_per_worker(available_cores(), 1))  # as a lone worker has
    run(args)


def run(args: argparse.Namespace) -> None:
    payloads = jpeg_inputs(64, args.image_size)
    tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    store = tmp / "store"
    probe_archive = resnet18_archive(store, batch_size=1, max_batch_delay_ms=10)
    handler, context = offline_handler(store, probe_archive, batch_size=16)
    print("warming up offline ...", flush=True)
    time_batches(lambda rows: handler(rows, context), payloads, 8, 3.0)
    sweep = offline_sweep(handler, context, payloads, args.seconds / 2)
    best = max(BATCH_SIZES, key=lambda b: sweep[b])
    print(f"offline sweep: {sweep}; best batch size {best}", flush=True)
    archive = resnet18_archive(store, batch_size=best, max_batch_delay_ms=10)
    noop = noop_archive(store, batch_size=8)

    rounds: list[Round] = []
    run = lambda rows: handler(rows, context)  # noqa: E731
    with ferry_server(store, [f"resnet18={archive}", f"noop={noop}"], tmp) as server:
        resnet_url = f"{server.url}/predictions/resnet18"
        load(resnet_url, payloads, 16, 64)  # warm-up
        requests = max(64, int(sweep[best] * args.seconds))
        for index in range(args.rounds):
            # Offline and server measured back to back, in alternating order, so drift in
            # the machine's speed hits both sides of each ratio alike.
            pair: dict[str, float] = {}
            for side in ("offline", "server") if index % 2 == 0 else ("server", "offline"):
                if side == "offline":
                    pair["ips"] = best / statistics.median(
                        time_batches(run, payloads, best, args.seconds)
                    )
                    pair["b1"] = (
                        statistics.median(time_batches(run, payloads, 1, args.seconds / 2)) * 1000
                    )
                else:
                    pair["server"] = load(resnet_url, payloads, 16, requests).throughput
                    pair["c1"] = load(resnet_url, payloads, 1, 40).latency_ms(50)
            noop_rps = load(f"{server.url}/predictions/noop", [b"x"], 16, 3000).throughput
            rounds.append(Round(pair["ips"], pair["b1"], pair["server"], pair["c1"], noop_rps))
            print(f"round {index + 1}: {rounds[-1]}", flush=True)

    publish(args.out, render(args, sweep, best, rounds).splitlines())


@dataclass(frozen=True)
class Round:
    offline_ips: float
    offline_b1_ms: float
    server_ips: float
    server_c1_p50_ms: float
    noop_rps: float

    @property
    def throughput_ratio(self) -> float:
        return self.server_ips / self.offline_ips

    @property
    def latency_overhead_ms(self) -> float:
        return self.server_c1_p50_ms - self.offline_b1_ms


def render(args, sweep: dict[int, float], best: int, rounds: list[Round]) -> str:  # type: ignore[no-untyped-def]
    med = statistics.median
    ratio = med([r.throughput_ratio for r in rounds])
    overhead = med([r.latency_overhead_ms for r in rounds])
    lines = [
        "# Ferry core benchmark: ResNet-18, image_classifier, JPEG input, 1 worker",
        "",
        f"Machine: {machine_description()}.",
        f"Inputs: 64 JPEGs of {args.image_size}x{args.image_size} px; ResNet-18 with random "
        "weights, TorchScript; handler: built-in `image_classifier` (decode, resize 256, crop 224, "
        "top-5). Produced by `make bench` (`benchmarks/core_benchmark.py`) in one run.",
        "",
        "## Offline handler pipeline (no server), images/s by batch size",
        "",
        "| batch size | " + " | ".join(str(b) for b in BATCH_SIZES) + " |",
        "|---" * (len(BATCH_SIZES) + 1) + "|",
        "| images/s | " + " | ".join(f"{sweep[b]:.1f}" for b in BATCH_SIZES) + " |",
        "",
        f"The server runs with batch size {best} (best of this sweep), `maxBatchDelay` 10 ms.",
        "",
        f"## Server against offline: medians of {len(rounds)} paired rounds",
        "",
        "| figure | offline | server | server / offline | target |",
        "|---|---|---|---|---|",
        f"| throughput at concurrency 16 vs offline at batch {best} | "
        f"{med([r.offline_ips for r in rounds]):.1f} img/s | "
        f"{med([r.server_ips for r in rounds]):.1f} img/s | {ratio:.3f} x | >= 0.9 x |",
        f"| p50 latency at concurrency 1 vs offline batch 1 | "
        f"{med([r.offline_b1_ms for r in rounds]):.1f} ms | "
        f"{med([r.server_c1_p50_ms for r in rounds]):.1f} ms | {overhead:+.1f} ms | <= +3 ms |",
        f"| no-op handler at concurrency 16 (the server's own overhead) | - | "
        f"{med([r.noop_rps for r in rounds]):.0f} req/s | - | - |",
        "",
        "Ratios and differences are taken within each round (offline and server measured back "
        "to back), then the median is shown.",
        "",
        "| round | offline img/s | server img/s | ratio | offline b1 ms | server c1 p50 ms | "
        "no-op req/s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {i} | {r.offline_ips:.1f} | {r.server_ips:.1f} | {r.throughput_ratio:.3f} | "
        f"{r.offline_b1_ms:.1f} | {r.server_c1_p50_ms:.1f} | {r.noop_rps:.0f} |"
        for i, r in enumerate(rounds, 1)
    ]
    lines += [
        "",
        "The load generator (`ferry_bench.load`, aiohttp, closed loop) runs on the same cores as "
        "the server and its worker, so it costs the server side some CPU. Both sides run with "
        "a worker's torch threads and glibc malloc settings (`ferry/worker/torch_setup.py`).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
