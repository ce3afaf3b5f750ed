"""Ferry's batch policies against TorchServe 0.12 and Triton (CPU, through PyTriton) on the
same arrivals, beside the ideal dispatcher, in one run.

Every server runs the same ResNet-18 (TorchScript, seeded random weights) behind the same
PIL + torch pipeline (``benchmarks/handlers/resnet_pipeline.py``): Ferry and TorchServe
through the TorchServe-style handler of one archive, Triton in its Python model. One
worker / instance, batch size 8, a 50 ms batch delay, 480x480 JPEGs. Three traces:

1. **Poisson sweep**: ``ferry bench limit`` on each server at the same offered rates (10%
   to 95% of X*, the rates the Ferry adaptive run derives from its profile, one seed):
   p50/p99 per rate, goodput, and the ideal dispatcher on the same arrivals.
2. **Bursty**: Poisson at 90% of X* for 1 s, silent for 2 s, repeated (same seed).
3. **Burst then idle**: 3 s at 90% of X*, then 5 req/s (one request at a time, in
   effect) for 8 s, three times: the p50 of the low-rate requests in the first second
   after each burst against their p50 in the last four seconds (steady state).

Plus the no-op handler's requests/s at 16 and 64 concurrent clients (closed loop, three
rounds alternating the server that goes first, medians): each server's own overhead.

Needs TorchServe (``scripts/torchserve-venv.sh``) and Triton (``scripts/triton-venv.sh``);
a server that is missing is reported as such and the others still run. Writes
``benchmarks/results/batching_peers.md`` and ``batching_peers.png``, each limit report
under ``benchmarks/results/batching_peers/``. Run: ``python benchmarks/batching_peers.py``
(about 25 minutes here; ``--reuse`` keeps the sweeps a previous run saved).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.common import (
    HANDLERS,
    ROOT,
    ferry_bench_limit,
    jpeg_inputs,
    machine_description,
    noop_archive,
    ts_style_resnet18_archive,
)
from ferry_bench.arrivals import step_of
from ferry_bench.latency_plot import plot_latency_against_load
from ferry_bench.load import LoadResult, LoadSpec, run_load
from ferry_bench.servers import ServerConfig, ServerFailed, free_port, start_server

RESULTS = ROOT / "benchmarks" / "results"
FOLDER = RESULTS / "batching_peers"
BATCH, DELAY_MS = 8, 50
FRACTIONS = "0.1,0.3,0.5,0.7,0.8,0.9,0.95"
SECONDS_PER_RATE = "15"
SLO = "1s"
POLICIES = ("adaptive", "immediate", "fixed_window")
SERVERS = (*(f"ferry {p}" for p in POLICIES), "torchserve", "triton")
PINNED = " pinned"
"""A Ferry server's name ends with it when it runs with ``cpu_pinning`` (peer_tail.py)."""
TORCHSERVE_VENV = Path(os.environ.get("FERRY_TORCHSERVE_VENV", ROOT / ".venv-torchserve"))
TRITON_VENV = Path(os.environ.get("FERRY_TRITON_VENV", ROOT / ".venv-triton"))
NOOP_SERVERS = ("ferry adaptive", "torchserve", "triton")
LOW_RATE, BURST_S, IDLE_S, CYCLES = 5.0, 3.0, 8.0, 3


@dataclass
class Target:
    """A running server's ResNet-18 and no-op URLs, and what to send them."""

    url: str
    noop_url: str
    inputs: list[Path]
    content_type: str
    noop_body: bytes
    noop_type: str


@dataclass
class Workload:
    archive: Path
    noop: Path
    weights: Path
    jpegs: list[Path]
    v2_requests: list[Path]
    v2_noop: bytes


def prepare(work: Path) -> Workload:
    store = work / "store"
    store.mkdir()
    archive = store / ts_style_resnet18_archive(store, BATCH, DELAY_MS)
    noop = store / noop_archive(store, BATCH)
    jpegs, v2 = [], []
    for index, jpeg in enumerate(jpeg_inputs(8, 480)):
        path = work / f"image{index}.jpg"
        path.write_bytes(jpeg)
        jpegs.append(path)
        document = {
            "inputs": [
                {
                    "name": "images",
                    "shape": [1, 1],
                    "datatype": "BYTES",
                    "data": [base64.b64encode(jpeg).decode()],
                }
            ]
        }
        request = work / f"image{index}.v2.json"
        request.write_text(json.dumps(document))
        v2.append(request)
    v2_noop = {"inputs": [{"name": "data", "shape": [1, 1], "datatype": "BYTES", "data": ["x"]}]}
    weights = store / ".ts-resnet18-src" / "resnet18.pt"
    return Workload(archive, noop, weights, jpegs, v2, json.dumps(v2_noop).encode())


# --- servers --------------------------------------------------------------------------------


@contextlib.contextmanager
def ferry_or_torchserve(
    kind: str, model: Path, policy: str | None, folder: Path, *, pinned: bool = False
) -> Iterator[str]:
    """The server's base URL; TorchServe's from its own environment."""
    config = ServerConfig(BATCH, DELAY_MS, 1, batch_policy=policy, cpu_pinning=pinned)
    saved = os.environ.get("TORCHSERVE_BIN_DIR")
    if kind == "torchserve":
        os.environ["TORCHSERVE_BIN_DIR"] = str(TORCHSERVE_VENV / "bin")
    try:
        with start_server(kind, model, config, folder) as server:
            yield server.inference_url
    finally:
        if saved is None:
            os.environ.pop("TORCHSERVE_BIN_DIR", None)
        else:
            os.environ["TORCHSERVE_BIN_DIR"] = saved


@contextlib.contextmanager
def triton(weights: Path, folder: Path) -> Iterator[str]:
    """Triton (PyTriton, CPU) serving resnet18 and noop; its HTTP base URL."""
    python = TRITON_VENV / "bin" / "python"
    if not python.exists():
        raise ServerFailed(f"no Triton environment at {TRITON_VENV} (run scripts/triton-venv.sh)")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        str(python),
        str(HANDLERS / "triton_resnet.py"),
        str(weights),
        *("--http-port", str(port), "--grpc-port", str(free_port())),
        *("--metrics-port", str(free_port()), "--batch-size", str(BATCH)),
        *("--delay-ms", str(DELAY_MS), "--threads", str(torch_threads())),
    ]
    log_path = folder / "triton.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    try:
        deadline = time.monotonic() + 180
        while not _ready(f"{url}/v2/models/resnet18/ready"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise ServerFailed(f"Triton did not start (log: {log_path})")
            time.sleep(0.5)  # polling a starting server's readiness
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=2).status_code == 200
    return False


def torch_threads() -> int:
    """What a Ferry worker gets here (one worker: every core), for Triton's model too."""
    from ferry.config.settings import available_cores

    return available_cores()


@contextlib.contextmanager
def serving(server: str, work: Workload, folder: Path, model: str = "resnet18") -> Iterator[Target]:
    """``server`` (one of SERVERS) up with ResNet-18, or with the no-op model when
    ``model`` is ``noop``."""
    if server == "triton":
        with triton(work.weights, folder) as url:
            yield Target(
                f"{url}/v2/models/resnet18/infer",
                f"{url}/v2/models/noop/infer",
                work.v2_requests,
                "application/json",
                work.v2_noop,
                "application/json",
            )
        return
    kind, _, policy = server.partition(" ")
    pinned = policy.endswith(PINNED)  # e.g. "ferry adaptive pinned": with cpu_pinning
    policy = policy.removesuffix(PINNED)
    archive = work.noop if model == "noop" else work.archive
    with ferry_or_torchserve(kind, archive, policy or None, folder, pinned=pinned) as url:
        yield Target(
            f"{url}/predictions/resnet18",
            f"{url}/predictions/noop",
            work.jpegs,
            "image/jpeg",
            b"x",
            "application/octet-stream",
        )


# --- the three traces and the no-op ---------------------------------------------------------


def sweep(server: str, work: Workload, rates: str | None, out: Path) -> dict[str, Any]:
    """``ferry bench limit`` on ``server``: at FRACTIONS of X* when ``rates`` is None."""
    shape = ["--fractions", FRACTIONS] if rates is None else ["--rates", rates]
    common = ["--duration", SECONDS_PER_RATE, *shape]
    if server.startswith("ferry"):
        policy = server.split(" ")[1]
        extra = ["--batch-policy", policy, "--content-type", "image/jpeg", *common]
        ferry_bench_limit(work.archive, work.jpegs, SLO, out, *extra)
    elif server == "torchserve":
        # The round trip is not measured here (the table's ideal is Ferry adaptive's).
        with tempfile.TemporaryDirectory() as tmp, serving(server, work, Path(tmp)) as target:
            extra = ["--url", target.url, "--content-type", target.content_type, *common]
            ferry_bench_limit(work.archive, target.inputs, SLO, out, *extra)
    else:
        if rates is None:
            raise ValueError("Triton runs at the rates of a Ferry sweep")
        external_sweep(server, work, [float(r) for r in rates.split(",")], out)
    report: dict[str, Any] = json.loads((out / "limit.json").read_text())
    return report


def external_sweep(server: str, work: Workload, rates: list[float], out: Path) -> None:
    """What ``ferry bench limit --url`` measures (peak at 2 batches of clients, then each
    rate open loop, same seed), for a server whose requests are not the archive's inputs
    (Triton's V2 JSON): limit would profile the archive with them."""
    points = []
    with tempfile.TemporaryDirectory() as tmp, serving(server, work, Path(tmp)) as target:
        clients = 2 * BATCH
        _load(target, concurrency=clients, requests=10 * clients)  # warm-up
        peak = _load(target, concurrency=clients, duration=float(SECONDS_PER_RATE))
        print(f"{server}: peak {peak.throughput:.1f} req/s", flush=True)
        for rate in rates:
            result = _load(target, rate=rate, duration=float(SECONDS_PER_RATE), seed=0)
            ok = bool(result.latencies_ms)
            points.append(
                {
                    "offered": rate,
                    "goodput": result.throughput,
                    "p50_ms": result.latency_ms(50) if ok else None,
                    "p99_ms": result.latency_ms(99) if ok else None,
                    "error_rate": result.error_rate,
                }
            )
            print(f"{server}: offered {rate:.1f}: {points[-1]}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    report = {"peak_goodput": peak.throughput, "peak_clients": clients, "points": points}
    (out / "limit.json").write_text(json.dumps(report, indent=1))


def _load(target: Target, **shape: Any) -> LoadResult:
    payloads = [p.read_bytes() for p in target.inputs]
    spec = LoadSpec(target.url, payloads, content_type=target.content_type, **shape)
    return asyncio.run(run_load(spec))


@dataclass
class TraceFigures:
    bursty_p50: float
    bursty_p99: float
    bursty_errors: float
    after_burst_p50: float
    steady_p50: float
    after_errors: float


def traces(server: str, work: Workload, peak_rate: float, folder: Path) -> TraceFigures:
    with serving(server, work, folder) as target:
        _load(target, concurrency=2 * BATCH, requests=20 * BATCH)  # warm-up
        bursty = _load(target, rate=peak_rate, bursts=(1.0, 2.0), duration=30.0, seed=1)
        steps = ((peak_rate, BURST_S), (LOW_RATE, IDLE_S)) * CYCLES
        after = _load(target, steps=steps, seed=2)
    first, steady = [], []
    for sample in after.samples:
        step = step_of(sample.sent_s, steps)
        if step % 2 == 0 or not sample.ok:
            continue
        since_burst = sample.sent_s - sum(s for _, s in steps[:step])
        if since_burst < 1.0:
            first.append(sample.latency_ms)
        elif since_burst >= IDLE_S - 4.0:
            steady.append(sample.latency_ms)
    return TraceFigures(
        bursty.latency_ms(50),
        bursty.latency_ms(99),
        bursty.error_rate,
        statistics.median(first),
        statistics.median(steady),
        after.error_rate,
    )


def noop_throughput(
    work: Workload, servers: list[str], rounds: int = 3
) -> dict[tuple[str, int], list[float]]:
    figures: dict[tuple[str, int], list[float]] = {}
    for index in range(rounds):
        order = servers if index % 2 == 0 else list(reversed(servers))
        for server in order:
            with (
                tempfile.TemporaryDirectory() as tmp,
                serving(server, work, Path(tmp), model="noop") as target,
            ):
                for clients in (16, 64):
                    spec = LoadSpec(
                        target.noop_url,
                        [target.noop_body],
                        concurrency=clients,
                        requests=4 * clients,
                        content_type=target.noop_type,
                    )
                    asyncio.run(run_load(spec))  # warm-up
                    spec = dataclasses.replace(spec, requests=None, duration=8.0)
                    result = asyncio.run(run_load(spec))
                    figures.setdefault((server, clients), []).append(result.throughput)
                    print(f"no-op {server} c{clients}: {result.throughput:.0f} req/s")
    return figures


# --- the report -------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _report_link(server: str) -> str:
    """A server's own report: ``limit.md`` from ``ferry bench limit``, or the figures of
    ``external_sweep`` (Triton), which writes no page of its own."""
    folder = FOLDER / server.replace(" ", "_")
    page = folder / "limit.md"
    return str((page if page.exists() else folder / "limit.json").relative_to(RESULTS))


def write_report(
    reports: dict[str, dict[str, Any]],
    trace_figures: dict[str, TraceFigures],
    noop: dict[tuple[str, int], list[float]],
    missing: dict[str, str],
    peak: float,
) -> None:
    reference = reports["ferry adaptive"]
    bounds = reference["bounds"]
    slo = reference["spec"]["slo_ms"]
    names = list(reports)
    lines = [
        "# Batching against TorchServe, Triton and the ideal dispatcher",
        "",
        f"Machine: {machine_description()}; servers and load generator share its cores.",
        "Command: `python benchmarks/batching_peers.py` (one run). Every server runs "
        "ResNet-18 (TorchScript, random weights) behind the same PIL + torch pipeline "
        "(`benchmarks/handlers/resnet_pipeline.py`): Ferry and TorchServe 0.12 through one "
        "`.mar` with a TorchServe-style handler, Triton (CPU, PyTriton "
        "`benchmarks/handlers/triton_resnet.py`) in its Python model with its dynamic "
        f"batcher. One worker or instance, batch size {BATCH}, batch delay {DELAY_MS} ms, "
        "480x480 JPEGs (Triton's requests carry them base64 in V2 JSON: its JSON holds text).",
        "",
    ]
    lines += [f"- **{name}** not measured: {why}" for name, why in missing.items()]
    lines += [
        "",
        "## 1. Poisson sweep",
        "",
        f"Bounds (Ferry adaptive's profile): L0 {bounds['floor_ms']:.1f} ms, X* "
        f"{bounds['ceiling_sequential']:.1f} req/s, X_SLO {bounds['slo_capacity'] or 0:.1f} "
        f"req/s at a p99 SLO of {slo:g} ms. {SECONDS_PER_RATE} s per rate, same seed and "
        "rates for every server. Reports: "
        + ", ".join(f"[{n}]({_report_link(n)})" for n in names)
        + ".",
        "",
        "p50 / p99 in ms per offered load:",
        "",
        "| offered req/s | " + " | ".join(names) + " | ideal |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for index, point in enumerate(reference["points"]):
        cells = []
        for report in reports.values():
            mine = report["points"][index]
            failed = f" ({mine['error_rate']:.0%} failed)" if mine["error_rate"] else ""
            cells.append(f"{_ms(mine['p50_ms'])} / {_ms(mine['p99_ms'])}{failed}")
        cells.append(f"{point['ideal_p50_ms']:.1f} / {point['ideal_p99_ms']:.1f}")
        lines.append(f"| {point['offered']:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "| ratio | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    rows: dict[str, list[str]] = {
        "low-load p50 - L0 (ms)": [],
        "p99 / ideal p99, worst rate": [],
        "peak goodput / X*": [],
        "goodput within the SLO / X_SLO": [],
    }
    for report in reports.values():
        points = report["points"]
        lowest = points[0]["p50_ms"]
        rows["low-load p50 - L0 (ms)"].append(
            _ms(None if lowest is None else lowest - bounds["floor_ms"])
        )
        ratios = [
            p["p99_ms"] / q["ideal_p99_ms"]
            for p, q in zip(points, reference["points"], strict=True)
            if p["p99_ms"] is not None
        ]
        rows["p99 / ideal p99, worst rate"].append(f"{max(ratios, default=0):.2f}")
        rows["peak goodput / X*"].append(
            f"{report['peak_goodput'] / bounds['ceiling_sequential']:.2f}"
        )
        within = [
            p["goodput"]
            for p in points
            if p["p99_ms"] is not None and p["p99_ms"] <= slo and p["error_rate"] == 0
        ]
        capacity = bounds["slo_capacity"]
        rows["goodput within the SLO / X_SLO"].append(
            f"{max(within, default=0.0) / capacity:.2f}" if capacity else "-"
        )
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows.items()]
    lines += ["", "![](batching_peers.png)", "", *_core_use_lines(reference)]
    if trace_figures:
        lines += [
            "## 2 and 3. Bursty, and burst then idle",
            "",
            f"Bursty: Poisson at {peak:.1f} req/s (90% of the first sweep's X*) for 1 s, then "
            f"2 s of silence, for 30 s. Burst then idle: {BURST_S:g} s at {peak:.1f} req/s, "
            f"then {LOW_RATE:g} req/s for {IDLE_S:g} s, "
            f"{CYCLES} times; the low-rate requests' p50 in the first second after each "
            "burst against the last four seconds of each quiet phase.",
            "",
            "| server | bursty p50 / p99 ms | after a burst: first-second p50 ms | "
            "steady p50 ms | difference ms |",
            "|---|---|---|---|---|",
        ]
        for name, t in trace_figures.items():
            failed = f" ({t.bursty_errors:.0%} failed)" if t.bursty_errors else ""
            lines.append(
                f"| {name} | {t.bursty_p50:.1f} / {t.bursty_p99:.1f}{failed} | "
                f"{t.after_burst_p50:.1f} | {t.steady_p50:.1f} | "
                f"{t.after_burst_p50 - t.steady_p50:+.1f} |"
            )
        lines.append("")
    if noop:
        servers = sorted({s for s, _ in noop}, key=list(SERVERS).index)
        lines += [
            "## No-op handler: each server's own overhead",
            "",
            "Closed loop, 8 s per point after a warm-up, three rounds alternating the server "
            "that goes first; medians (req/s). Triton's no-op is its Python model over V2 "
            "JSON; Ferry's and TorchServe's a handler over their REST path.",
            "",
            "| clients | " + " | ".join(servers) + " | Ferry / TorchServe |",
            "|---|" + "---|" * (len(servers) + 1),
        ]
        for clients in (16, 64):
            medians = {s: statistics.median(noop[(s, clients)]) for s in servers}
            ratio = (
                f"{medians['ferry adaptive'] / medians['torchserve']:.2f}"
                if "torchserve" in medians
                else "-"
            )
            row = " | ".join(f"{medians[s]:.0f}" for s in servers)
            lines.append(f"| {clients} | {row} | {ratio} |")
        lines.append("")
    (RESULTS / "batching_peers.md").write_text("\n".join(lines))
    plot(reports)


def _core_use_lines(reference: dict[str, Any]) -> list[str]:
    """Who used the cores during Ferry adaptive's sweep: what X* counts as the model's."""
    measured = [p for p in reference["points"] if p.get("core_use")]
    if not measured:
        return []
    cores = measured[0]["core_use"]["cores"]
    lines = [
        f"Who used the {cores} cores during Ferry adaptive's sweep (X* and the ideal count "
        "them all as the model's; CPU ms per answered request):",
        "",
        "| offered req/s | cores busy | load generator: cores | load generator ms | "
        "frontend ms | worker ms |",
        "|---|---|---|---|---|---|",
    ]
    for point in measured:
        used = point["core_use"]
        lines.append(
            f"| {point['offered']:.1f} | {used['cores_busy']:.2f} | "
            f"{used['generator_cores']:.2f} | {_cpu_ms(used['generator_ms'])} | "
            f"{_cpu_ms(used['server_main_ms'])} | {_cpu_ms(used['server_workers_ms'])} |"
        )
    return [*lines, ""]


def _cpu_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot(reports: dict[str, dict[str, Any]]) -> None:
    reference = reports["ferry adaptive"]
    series = {
        name: [(p["offered"], p["p50_ms"], p["p99_ms"]) for p in report["points"]]
        for name, report in reports.items()
    }
    series["ideal"] = [
        (p["offered"], p["ideal_p50_ms"], p["ideal_p99_ms"]) for p in reference["points"]
    ]
    bounds = reference["bounds"]
    plot_latency_against_load(
        series,
        RESULTS / "batching_peers.png",
        "ResNet-18: Ferry's policies, TorchServe, Triton",
        machine_description(),
        marks={f"X* {bounds['ceiling_sequential']:.0f} req/s": bounds["ceiling_sequential"]},
        floor_ms=bounds["floor_ms"],
        slo_ms=reference["spec"]["slo_ms"],
    )


def saved_rates() -> str | None:
    """The offered rates of a sweep a previous run saved: a server measured again runs
    at the same rates as the others."""
    for server in SERVERS:
        saved = FOLDER / server.replace(" ", "_") / "limit.json"
        if saved.exists():
            points = json.loads(saved.read_text())["points"]
            return ",".join(f"{p['offered']:.3f}" for p in points)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help=f"keep what a previous run saved under {FOLDER.relative_to(ROOT)} (sweeps, "
        "traces, no-op figures) and measure only the rest",
    )
    reuse = parser.parse_args().reuse
    reports: dict[str, dict[str, Any]] = {}
    trace_figures: dict[str, TraceFigures] = {}
    missing: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = prepare(Path(tmp))
        rates = saved_rates() if reuse else None
        for server in SERVERS:
            out = FOLDER / server.replace(" ", "_")
            try:
                saved = out / "limit.json"
                if reuse and saved.exists():
                    reports[server] = json.loads(saved.read_text())
                else:
                    reports[server] = sweep(server, work, rates, out)
            except (ServerFailed, subprocess.CalledProcessError) as error:
                missing[server] = str(error)
                print(f"{server}: {error}", flush=True)
                continue
            if rates is None:
                rates = ",".join(f"{p['offered']:.3f}" for p in reports[server]["points"])
        # Every server's bursts at the same rate: the sweep's 90% of X* (the first sweep's
        # X*, which a server measured again in a later run does not change).
        peak = float(rates.split(",")[FRACTIONS.split(",").index("0.9")]) if rates else 0.0
        for server in reports:
            saved = FOLDER / server.replace(" ", "_") / "traces.json"
            if reuse and saved.exists():
                trace_figures[server] = TraceFigures(**json.loads(saved.read_text()))
                continue
            trace_figures[server] = traces(server, work, peak, Path(tmp) / f"trace-{server}")
            saved.write_text(json.dumps(dataclasses.asdict(trace_figures[server])))
            print(f"traces {server}: {trace_figures[server]}", flush=True)
        saved_noop = FOLDER / "noop.json"
        noop: dict[tuple[str, int], list[float]] = {}
        if reuse and saved_noop.exists():
            noop = {(s, int(c)): v for s, c, v in json.loads(saved_noop.read_text())}
        todo = [s for s in reports if s in NOOP_SERVERS and (s, 16) not in noop]
        noop |= noop_throughput(work, todo) if todo else {}
        saved_noop.write_text(json.dumps([[s, c, v] for (s, c), v in noop.items()]))
    write_report(reports, trace_figures, noop, missing, peak)


if __name__ == "__main__":
    main()
