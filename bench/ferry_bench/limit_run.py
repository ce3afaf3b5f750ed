"""``ferry bench limit``: measure a model's limit and how near a server comes to it.

1. profile the handler offline at batch sizes 1, 2, 4 ... up to the server's batch size:
   each batch's cost ``cost(b)``, split into the model's forward pass and the rest
   (pre- and postprocessing) where the handler exposes its model;
2. the server's round trip on a no-op model (a Ferry server started here, or
   ``--noop-url``), which with ``cost(1)`` makes the latency floor L0;
3. the server under test (a Ferry server with the model, or ``--url``: any server with
   TorchServe's API, TorchServe included): a warm-up, its peak goodput from a closed loop,
   then Poisson load at fractions of the ceiling X*, each rate's arrival trace also fed
   to the ideal dispatcher (``limit.simulate``) with the profiled costs.

The report (``limit.md``, ``limit.json``, ``limit.png``) puts the server's p50/p99 per
offered load beside the ideal's, and states three ratios: low-load p50 - L0, peak goodput
/ X*, goodput within the SLO / X_SLO.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ferry_bench.core_use import CoreClock, CoreUse
from ferry_bench.limit import Bounds, bounds, cost_function, simulate
from ferry_bench.load import LoadResult, LoadSpec, run_load
from ferry_bench.servers import ServerConfig, model_config_document, model_identity, start_server

NOOP_HANDLER = '''"""No work: one short answer per request (the round trip alone)."""


def handle(data, context):
    return None if data is None else ["ok"] * len(data)
'''

Say = Callable[[str], None]


@dataclass(frozen=True)
class LimitSpec:
    model: Path
    inputs: list[Path]
    slo_ms: float
    batch_size: int
    max_batch_delay: int
    workers: int
    fractions: list[float]
    seconds: float
    """Per offered rate, and for the peak."""
    profile_seconds: float
    seed: int = 0
    content_type: str = "application/octet-stream"
    url: str | None = None
    """An already running server's prediction URL, instead of starting Ferry."""
    noop_url: str | None = None
    batch_policy: str | None = None
    """Ferry's batch policy for the server started here (None: the archive's)."""
    rates: list[float] | None = None
    """Offered loads in requests/s, instead of ``fractions`` of X* (so several runs offer
    the same arrivals)."""


@dataclass
class RatePoint:
    offered: float
    goodput: float
    p50_ms: float | None
    p99_ms: float | None
    error_rate: float
    ideal_p50_ms: float
    ideal_p99_ms: float
    ideal_mean_batch: float
    core_use: CoreUse | None = None
    """Who used the cores during this rate's run."""


@dataclass
class LimitReport:
    spec: LimitSpec
    costs: dict[int, dict[str, float]]
    round_trip_ms: float
    round_trip_source: str
    bounds: Bounds
    peak_goodput: float
    peak_concurrency: int
    points: list[RatePoint] = field(default_factory=list)

    @property
    def low_load_gap_ms(self) -> float | None:
        """Low-load p50 - L0: what the server adds to a lone request beyond the floor."""
        lowest = self.points[0] if self.points else None
        return (
            None
            if lowest is None or lowest.p50_ms is None
            else lowest.p50_ms - self.bounds.floor_ms
        )

    @property
    def goodput_within_slo(self) -> float:
        """The best goodput at an offered rate whose p99 met the SLO (0 if none did)."""
        met = [
            p.goodput
            for p in self.points
            if p.p99_ms is not None and p.p99_ms <= self.spec.slo_ms and p.error_rate == 0
        ]
        return max(met, default=0.0)


def batch_sizes_up_to(largest: int) -> list[int]:
    """1, 2, 4 ... below ``largest``, and ``largest``.

    >>> batch_sizes_up_to(8), batch_sizes_up_to(6), batch_sizes_up_to(1)
    ([1, 2, 4, 8], [1, 2, 4, 6], [1])
    """
    sizes, size = [], 1
    while size < largest:
        sizes.append(size)
        size *= 2
    return [*sizes, largest]


def profile_costs(spec: LimitSpec, work: Path, say: Say) -> dict[int, dict[str, float]]:
    """Each batch size's median cost by stage: ``inference`` (the model's forward pass)
    and ``pre/post`` (the rest of the handler), or ``handler`` when its model is hidden.

    ``ferry bench profile`` measures them in a process started as a worker is (its
    environment, its share of the cores as torch threads): the costs are a worker's."""
    from ferry.config.settings import available_cores, threads_per_worker
    from ferry.wire.environment import worker_environment

    out = work / "profile"
    sizes = batch_sizes_up_to(spec.batch_size)
    argv = [
        sys.executable,
        "-m",
        "ferry",
        "bench",
        "profile",
        str(spec.model),
        "--input",
        ",".join(map(str, spec.inputs)),
        "--batch-sizes",
        ",".join(map(str, sizes)),
        "--seconds",
        f"{spec.profile_seconds:g}",
        "--threads",
        str(threads_per_worker(available_cores(), spec.workers)),
        "--out",
        str(out),
    ]
    # Each size times the handler and the model for profile_seconds, after loading: far
    # less than this unless the profile hangs.
    bound = 600 + 4 * len(sizes) * (spec.profile_seconds + 60)
    try:
        run = subprocess.run(
            argv,
            env=worker_environment(os.environ),
            capture_output=True,
            text=True,
            check=False,
            timeout=bound,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"profiling did not finish within {bound:.0f} s") from None
    if run.returncode != 0:
        raise RuntimeError(f"profiling failed: {run.stderr.strip()[-500:]}")
    points = json.loads((out / "profile.json").read_text())["points"]
    costs: dict[int, dict[str, float]] = {}
    for batch in sizes:
        mine = {p["variant"]: p["latency_ms_median"] for p in points if p["batch_size"] == batch}
        whole = mine["handler"]
        if "model" in mine:
            model = min(whole, mine["model"])
            costs[batch] = {"pre/post": round(whole - model, 3), "inference": model}
        else:
            costs[batch] = {"handler": whole}
        say(f"profile: batch {batch}: {whole:.2f} ms ({costs[batch]})")
    return costs


def _load(url: str, payloads: list[bytes], content_type: str, **shape: Any) -> LoadResult:
    spec = LoadSpec(url, payloads, content_type=content_type, **shape)
    return asyncio.run(run_load(spec))


def _check(result: LoadResult, what: str) -> None:
    if not result.latencies_ms:
        errors = dict(result.statuses) | dict(result.transport_errors)
        raise RuntimeError(f"{what}: no request succeeded ({errors})")


@contextlib.contextmanager
def _served(
    spec: LimitSpec, model: Path, config: ServerConfig, folder: Path
) -> Iterator[tuple[str, int]]:
    """The model's prediction URL on a Ferry server started here, and the server's pid."""
    name, _ = model_identity(model)
    with start_server("ferry", model, config, folder) as server:
        yield f"{server.inference_url}/predictions/{name}", server.pid


def _noop_archive(folder: Path) -> Path:
    from ferry.store.writer import ArchiveSpec, write_archive

    folder.mkdir(parents=True, exist_ok=True)
    handler = folder / "noop_handler.py"
    handler.write_text(NOOP_HANDLER)
    return write_archive(ArchiveSpec(model_name="noop", handler=str(handler)), folder, force=True)


def round_trip(spec: LimitSpec, work: Path, say: Say) -> tuple[float, str]:
    """The median latency of one request at a time to a no-op model: what the server
    and the network add to any request."""
    if spec.url is not None and spec.noop_url is None:
        return 0.0, "not measured (give --noop-url): L0 is the model's cost alone"
    with contextlib.ExitStack() as stack:
        url = spec.noop_url
        source = f"median of 300 sequential requests to {url}"
        if url is None:
            archive = _noop_archive(work / "noop-store")
            url, _ = stack.enter_context(
                _served(spec, archive, ServerConfig(1, 0, 1), work / "noop")
            )
            source = "median of 300 sequential requests to a no-op model on a Ferry server"
        _load(url, [b"x"], "application/octet-stream", concurrency=1, requests=50)  # warm-up
        result = _load(url, [b"x"], "application/octet-stream", concurrency=1, requests=300)
        _check(result, "round trip")
    value = statistics.median(result.latencies_ms)
    say(f"round trip: {value:.2f} ms")
    return value, source


def measure_limit(spec: LimitSpec, work: Path, say: Say) -> LimitReport:
    costs = profile_costs(spec, work, say)
    trip, trip_source = round_trip(spec, work, say)
    limits = bounds(costs, trip, spec.slo_ms, spec.workers)
    say(
        f"bounds: L0 {limits.floor_ms:.2f} ms, X* {limits.ceiling_sequential:.1f} req/s "
        f"(pipelined {limits.ceiling_pipelined:.1f}), X_SLO {limits.slo_capacity or 0:.1f} req/s"
    )
    payloads = [path.read_bytes() for path in spec.inputs]
    config = ServerConfig(
        spec.batch_size, spec.max_batch_delay, spec.workers, batch_policy=spec.batch_policy
    )
    cost_ms = cost_function(costs)
    with contextlib.ExitStack() as stack:
        url, server_pid = spec.url, None  # a server given by URL: its processes are unknown
        if url is None:
            url, server_pid = stack.enter_context(
                _served(spec, spec.model, config, work / "server")
            )
        clock = CoreClock(server_pid)
        concurrency = 2 * spec.batch_size * spec.workers
        _check(
            _load(
                url, payloads, spec.content_type, concurrency=concurrency, requests=10 * concurrency
            ),
            "warm-up",
        )
        peak = _load(
            url, payloads, spec.content_type, concurrency=concurrency, duration=spec.seconds
        )
        _check(peak, "peak")
        say(f"peak: {peak.throughput:.1f} req/s at {concurrency} clients")
        report = LimitReport(spec, costs, trip, trip_source, limits, peak.throughput, concurrency)
        offered = spec.rates or [f * limits.ceiling_sequential for f in spec.fractions]
        for rate in offered:
            fraction = rate / limits.ceiling_sequential
            before = clock.snapshot()
            result = _load(
                url, payloads, spec.content_type, rate=rate, duration=spec.seconds, seed=spec.seed
            )
            used = clock.between(before, clock.snapshot(), result.answered)
            ideal = simulate(result.arrivals_s, cost_ms, spec.batch_size, spec.workers, trip)
            point = RatePoint(
                offered=rate,
                goodput=result.throughput,
                p50_ms=result.latency_ms(50) if result.latencies_ms else None,
                p99_ms=result.latency_ms(99) if result.latencies_ms else None,
                error_rate=result.error_rate,
                ideal_p50_ms=ideal.latency_ms(50),
                ideal_p99_ms=ideal.latency_ms(99),
                ideal_mean_batch=statistics.mean(ideal.batch_sizes) if ideal.batch_sizes else 0.0,
                core_use=used,
            )
            report.points.append(point)
            say(
                f"offered {rate:.1f} req/s ({fraction:.0%} of X*): goodput {point.goodput:.1f}, "
                f"p50/p99 {point.p50_ms or math.nan:.1f}/{point.p99_ms or math.nan:.1f} ms; "
                f"ideal {point.ideal_p50_ms:.1f}/{point.ideal_p99_ms:.1f} ms; "
                f"{used.cores_busy:.2f} of {used.cores} cores busy, "
                f"{used.generator_cores:.2f} by the load generator"
            )
    return report


def default_settings(model: Path) -> tuple[int, int, int]:
    """The archive's batch size, batch delay and workers (model-config.yaml), else 1, 0, 1."""
    document = model_config_document(model)
    return (
        int(document.get("batchSize", 1)),
        int(document.get("maxBatchDelay", 0)),
        int(document.get("minWorkers", 1)),
    )


def echo(text: str) -> None:
    print(text, file=sys.stderr)


__all__ = [
    "LimitReport",
    "LimitSpec",
    "RatePoint",
    "batch_sizes_up_to",
    "default_settings",
    "echo",
    "measure_limit",
]
