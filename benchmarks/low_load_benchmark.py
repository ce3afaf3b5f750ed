"""Where a lone request's time goes at low load: the server against the same pipeline
offline, each back to back and after the idle gaps of a low-rate Poisson arrival.

    python benchmarks/low_load_benchmark.py --out benchmarks/results/low_load.md

The limit report's floor L0 is the batch-1 pipeline timed back to back plus the no-op
round trip, also back to back. At 10% of capacity a request arrives after ~250 ms of
silence, and on a small machine that silence has a cost of its own (caches, idle cores and
sleeping threads wake up) that no server can avoid. This benchmark separates the two, in
interleaved rounds (order alternating, medians):

- ``offline``: the archive's handler in this process (started with a worker's environment
  and torch threads), batch 1, back to back and after each gap of the arrival trace;
- ``served``: the same archive behind ``ferry serve`` (one worker, the default batch
  policy), one request at a time, back to back and after the same gaps; the server's own
  stage timings (its metrics) say how much of the difference is inside the worker;
- ``pinned``: the same archive on a second server started with ``cpu_pinning=true`` (the
  worker's torch threads bound to cores of their own), the same requests;
- ``no-op``: a no-op archive on the first server, the round trip, back to back and after
  the gaps.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.common import (
    jpeg_inputs,
    machine_description,
    noop_archive,
    offline_handler,
    publish,
    ts_style_resnet18_archive,
)
from benchmarks.server import ferry_server
from ferry.config.settings import available_cores, threads_per_worker
from ferry.wire.environment import worker_environment
from ferry.worker.torch_setup import configure_torch

BATCH, DELAY_MS = 8, 50
MODES = ("offline", "served", "pinned", "noop")
SERVED = ("served", "pinned")
STAGE = re.compile(r'^ferry_batch_stage_seconds_sum\{model_name="resnet18".*stage="(\w+)"\} (\S+)')
REQUEST = re.compile(r'^ferry_(request_duration|queue_wait)_seconds_sum\{model_name="resnet18"')


@dataclass
class Figures:
    """Per mode and pacing (``b2b`` or ``idle``): each round's latencies, in ms."""

    latencies: dict[str, list[list[float]]] = field(default_factory=dict)
    server_ms: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    """Served requests, by mode and pacing: the server's own per-request means (stages,
    queue, total) by round."""

    def add(self, key: str, values: list[float]) -> None:
        self.latencies.setdefault(key, []).append(values)

    def p(self, key: str, q: float) -> float:
        """The median over rounds of each round's ``q`` percentile."""
        return statistics.median(_percentile(values, q) for values in self.latencies[key])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/low_load.md"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=50, help="per mode and round")
    parser.add_argument("--fraction", type=float, default=0.1, help="of X*, the arrival rate")
    parser.add_argument("--image-size", type=int, default=480)
    args = parser.parse_args()
    environment = worker_environment(os.environ)
    if any(os.environ.get(key) != value for key, value in environment.items()):
        # The offline side runs with the memory settings a worker gets, or it is no floor.
        os.execve(sys.executable, [sys.executable, *sys.argv], environment)
    configure_torch(threads_per_worker(available_cores(), 1))  # as a lone worker has
    run(args)


def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ferry-low-load-"))
    store = tmp / "store"
    store.mkdir()
    archive = ts_style_resnet18_archive(store, BATCH, DELAY_MS)
    noop = noop_archive(store, BATCH)
    payloads = jpeg_inputs(8, args.image_size)
    handler, context = offline_handler(store, archive, BATCH)

    def offline(index: int) -> None:
        handler([{"body": bytearray(payloads[index % len(payloads)])}], context)

    for index in range(20):
        offline(index)
    batch_ms = _median_ms(lambda i: handler(_rows(payloads, BATCH, i), context), 8)
    rate = args.fraction * BATCH / (batch_ms / 1000)
    print(f"offline batch of {BATCH}: {batch_ms:.1f} ms; arrivals at {rate:.1f} req/s", flush=True)
    archives = [f"resnet18={archive}", f"noop={noop}"]
    (tmp / "pinned").mkdir()
    with (
        ferry_server(store, archives, tmp) as server,
        ferry_server(store, archives[:1], tmp / "pinned", "--cpu-pinning", "true") as pinned,
        httpx.Client(timeout=60) as client,
    ):
        calls = {
            **_served_calls(client, server.url, payloads),
            "pinned": _served_calls(client, pinned.url, payloads)["served"],
            "offline": offline,
        }
        sums = {
            "served": lambda: _server_sums(client, server.metrics_url),
            "pinned": lambda: _server_sums(client, pinned.metrics_url),
        }
        figures = _rounds(args, rate, calls, sums)
    publish(args.out, render(args, rate, batch_ms, figures))


def _rounds(
    args: argparse.Namespace,
    rate: float,
    calls: dict[str, Callable[[int], object]],
    server_sums: dict[str, Callable[[], dict[str, float]]],
) -> Figures:
    """Every mode, back to back and idle, in ``args.rounds`` rounds of alternating order."""
    figures = Figures()
    for name in ("served", "pinned", "noop"):  # warm-up
        for index in range(20):
            calls[name](index)
    for index in range(args.rounds):
        gaps = _gaps(rate, args.requests, seed=index)
        order = MODES if index % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            for pacing in ("b2b", "idle"):
                before = server_sums[mode]() if mode in SERVED else {}
                times = _timed(calls[mode], len(gaps), gaps if pacing == "idle" else None)
                figures.add(f"{mode} {pacing}", times)
                if mode in SERVED:
                    after = server_sums[mode]()
                    per_request = {
                        key: (after[key] - before.get(key, 0.0)) * 1000 / len(times)
                        for key in after
                    }
                    figures.server_ms.setdefault(f"{mode} {pacing}", []).append(per_request)
        summary = ", ".join(
            f"{key} {statistics.median(values[-1]):.1f}"
            for key, values in figures.latencies.items()
        )
        print(f"round {index + 1} p50 ms: {summary}", flush=True)
    return figures


def _rows(payloads: list[bytes], size: int, start: int) -> list[dict[str, bytearray]]:
    return [{"body": bytearray(payloads[(start + k) % len(payloads)])} for k in range(size)]


def _median_ms(call: Callable[[int], object], times: int) -> float:
    durations = []
    for index in range(times):
        start = time.perf_counter()
        call(index)
        durations.append((time.perf_counter() - start) * 1000)
    return statistics.median(durations)


def _gaps(rate: float, count: int, seed: int) -> list[float]:
    """The silences between the requests of a Poisson arrival at ``rate`` (seconds)."""
    generator = random.Random(seed)
    return [generator.expovariate(rate) for _ in range(count)]


def _timed(call: Callable[[int], object], count: int, gaps: list[float] | None) -> list[float]:
    """Each of ``count`` calls' time in ms, one after another, after its gap when given."""
    times = []
    for index in range(count):
        if gaps is not None:
            time.sleep(gaps[index])
        start = time.perf_counter()
        call(index)
        times.append((time.perf_counter() - start) * 1000)
    return times


def _served_calls(
    client: httpx.Client, url: str, payloads: list[bytes]
) -> dict[str, Callable[[int], object]]:
    def resnet(index: int) -> None:
        body = payloads[index % len(payloads)]
        response = client.post(
            f"{url}/predictions/resnet18", content=body, headers={"content-type": "image/jpeg"}
        )
        response.raise_for_status()

    def noop(index: int) -> None:
        client.post(f"{url}/predictions/noop", content=b"x").raise_for_status()

    return {"served": resnet, "noop": noop}


def _server_sums(client: httpx.Client, metrics_url: str) -> dict[str, float]:
    """The ResNet model's cumulative stage, queue and request seconds."""
    sums: dict[str, float] = {}
    for line in client.get(f"{metrics_url}/metrics").text.splitlines():
        if stage := STAGE.match(line):
            sums[stage.group(1)] = float(stage.group(2))
        elif request := REQUEST.match(line):
            sums[request.group(1)] = float(line.rsplit(" ", 1)[1])
    return sums


def render(args: argparse.Namespace, rate: float, batch_ms: float, figures: Figures) -> list[str]:
    p50 = {key: figures.p(key, 50) for key in figures.latencies}
    p90 = {key: figures.p(key, 90) for key in figures.latencies}
    floor = p50["offline b2b"] + p50["noop b2b"]
    served_idle = p50["served idle"]
    pinned_idle = p50["pinned idle"]
    machine = p50["offline idle"] - p50["offline b2b"]
    own_idle = served_idle - p50["offline idle"] - p50["noop idle"]
    own_b2b = p50["served b2b"] - p50["offline b2b"] - p50["noop b2b"]
    server = {
        pacing: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        for pacing, rounds in figures.server_ms.items()
    }
    lines = [
        "# Low load: where a lone request's time goes",
        "",
        f"Machine: {machine_description()}. The server, the offline pipeline and the client "
        "share its cores.",
        "",
        "Command: `python benchmarks/low_load_benchmark.py` (one run). ResNet-18 (TorchScript, "
        f"random weights) behind the TorchServe-style PIL + torch handler of the peer "
        f"benchmark, {args.image_size}x{args.image_size} JPEGs, one worker, batch size {BATCH}, "
        f"maxBatchDelay {DELAY_MS} ms, the default (`adaptive`) batch policy. Arrivals: "
        f"Poisson at {rate:.1f} req/s ({args.fraction:.0%} of X* from the offline batch of "
        f"{BATCH}, {batch_ms:.0f} ms), one seeded trace per round. {args.rounds} rounds of "
        f"{args.requests} requests per row, order alternating; figures are the median over "
        "rounds of each round's percentile. `b2b`: each request as soon as the last was "
        "answered; `idle`: after the trace's gap.",
        "",
        "| what | p50 ms | p90 ms |",
        "|---|---|---|",
    ]
    names = {
        "offline": "pipeline offline, batch 1",
        "served": "served, one request at a time",
        "pinned": "served with `cpu_pinning`, one request at a time",
        "noop": "no-op round trip",
    }
    for mode in MODES:
        for pacing in ("b2b", "idle"):
            key = f"{mode} {pacing}"
            lines.append(f"| {names[mode]}, {pacing} | {p50[key]:.1f} | {p90[key]:.1f} |")
    lines += [
        "",
        "Inside the server, per served request (its metrics: time in the queue, in each "
        "handler stage in the worker, and arrival to answer), medians over rounds, ms:",
        "",
        "| server, pacing | queue | preprocess | inference | postprocess | whole request |",
        "|---|---|---|---|---|---|",
    ]
    for pacing, sums in server.items():
        cells = [sums.get(k, 0.0) for k in ("queue_wait", "preprocess", "inference")]
        cells += [sums.get("postprocess", 0.0), sums.get("request_duration", 0.0)]
        lines.append(f"| {pacing} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    lines += [
        "",
        "## What it shows",
        "",
        f"- The limit report's floor L0 (offline batch 1 plus the no-op round trip, both back "
        f"to back) is {floor:.1f} ms; served at this rate, the p50 is {served_idle:.1f} ms: "
        f"{served_idle - floor:+.1f} ms over L0.",
        f"- The same pipeline offline, with no server at all, pays {machine:+.1f} ms after the "
        "same silences: the machine's own cost of idling.",
        f"- What serving adds beyond the pipeline and the no-op round trip: {own_b2b:+.1f} ms "
        f"back to back, {own_idle:+.1f} ms after idling (served minus offline minus no-op, "
        "each at the same pacing).",
        f"- With `cpu_pinning`, served at this rate: p50 {pinned_idle:.1f} ms, "
        f"{pinned_idle - floor:+.1f} ms over L0 ({pinned_idle - served_idle:+.1f} ms against "
        f"the default server); back to back {p50['pinned b2b']:.1f} ms against "
        f"{p50['served b2b']:.1f} ms.",
    ]
    return lines


if __name__ == "__main__":
    main()
