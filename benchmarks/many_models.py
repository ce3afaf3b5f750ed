"""Many models on one machine: Ferry against TorchServe 0.12 on the same archive, in one run.

    bash scripts/torchserve-venv.sh           # TorchServe 0.12 in .venv-torchserve
    TORCHSERVE_BIN_DIR=.venv-torchserve/bin .venv/bin/python benchmarks/many_models.py

One ResNet-18 TorchScript archive (seeded random weights, the TorchServe-style handler of
``benchmarks/handlers/resnet_handler.py`` that both servers run) registered under N names.

1. **Resident** (both servers, alternating which goes first): N models, one worker each,
   each asked once as soon as it answers: seconds from launch until every model has
   answered, the server's processes, and the PSS of all of them (frontend, JVM, workers)
   once all have answered. Ferry runs with its defaults: past ``max_workers_total`` the
   models share worker processes.
2. **Hot model** (Ferry): one model under closed-loop load, alone in a process of its own
   against the same model in a shared process beside N-1 idle ones; rounds alternate.
3. **Resident under Zipf load** (both servers): the N models all resident, requests
   picked by Zipf popularity, Poisson arrivals: latency per class (hot: the 3 most
   popular, warm: the next 17, cold: the rest), and PSS.
4. **On demand** (Ferry): M models with ``load_models_on_demand`` and a host memory budget
   that holds K of them (their measured footprint), the same kind of load: latency per
   class, loads and evictions, the server's PSS over time, errors; each load's time
   (from the server's log) against a lone model's load on an idle server.
   TorchServe cannot load M models on this machine (a process each), so it has no part 4.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    closed_loop,
    jpeg_inputs,
    machine_description,
    publish,
    ts_style_resnet18_archive,
)
from ferry_bench.arrivals import poisson_offsets
from ferry_bench.servers import free_port, log_reason, server_environment, stop_group

MB = 1 << 20
APIS = ("inference", "management", "metrics", "grpc_inference", "grpc_management", "workers")


# --- servers of many models ------------------------------------------------------------


@dataclass
class Server:
    kind: str
    process: subprocess.Popen[bytes]
    url: str
    management_url: str
    log_path: Path
    launched: float

    def processes(self) -> list[int]:
        """Every process of the server's session (it was started in a session of its own)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == self.process.pid:  # field 6, the session id
                found.append(int(entry.name))
        return found

    def pss_bytes(self) -> int:
        return sum(pss(pid) for pid in self.processes())


def pss(pid: int) -> int:
    """A process's proportional set size, in bytes (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    match = re.search(r"^Pss:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def write_properties(
    folder: Path, store: Path, names: list[str], archive: str, ports: dict[str, int], **extra: str
) -> Path:
    models = {
        name: {
            "1.0": {
                "marName": archive,
                "minWorkers": 1,
                "maxWorkers": 1,
                "batchSize": 1,
                "maxBatchDelay": 10,
                "responseTimeout": 300,
            }
        }
        for name in names
    }
    lines = [
        f"inference_address=http://127.0.0.1:{ports['inference']}",
        f"management_address=http://127.0.0.1:{ports['management']}",
        f"metrics_address=http://127.0.0.1:{ports['metrics']}",
        f"grpc_inference_port={ports['grpc_inference']}",
        f"grpc_management_port={ports['grpc_management']}",
        f"initial_worker_port={ports['workers']}",
        f"model_store={store}",
        "load_models=" + ",".join(f"{name}={archive}" for name in names),
        f"models={json.dumps(models)}",
        "default_workers_per_model=1",
        "disable_token_authorization=true",
        "enable_model_api=true",
        "job_queue_size=1000",
        *(f"{key}={value}" for key, value in extra.items()),
    ]
    path = folder / "config.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def launch(
    kind: str, folder: Path, store: Path, names: list[str], archive: str, **extra: str
) -> Iterator[Server]:
    folder.mkdir(parents=True, exist_ok=True)
    ports = {api: free_port() for api in APIS}
    properties = write_properties(folder, store, names, archive, ports, **extra)
    if kind == "ferry":
        argv = [sys.executable, "-m", "ferry", "serve", "--ts-config", str(properties)]
        argv += ["--access-log", "false"]
    else:
        executable = shutil.which("torchserve", path=os.environ.get("TORCHSERVE_BIN_DIR"))
        if executable is None:
            raise SystemExit("torchserve not found: set TORCHSERVE_BIN_DIR=.venv-torchserve/bin")
        argv = [os.path.abspath(executable), "--start", "--foreground", "--ncs"]
        argv += ["--ts-config", str(properties), "--model-store", str(store)]
    path = f"{Path(argv[0]).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    log_path = folder / "server.log"
    launched = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            env={**server_environment(), "PATH": path},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            start_new_session=True,
        )
    server = Server(
        kind,
        process,
        f"http://127.0.0.1:{ports['inference']}",
        f"http://127.0.0.1:{ports['management']}",
        log_path,
        launched,
    )
    try:
        yield server
    finally:
        stop_group(process)


def answer_all(server: Server, names: list[str], payload: bytes, timeout: float = 900) -> float:
    """Ask every model until each has answered once; seconds from launch until the last did."""
    waiting = list(names)
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=300) as client:
        while waiting:
            if server.process.poll() is not None:
                raise RuntimeError(f"{server.kind} exited: {log_reason(server.log_path)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{server.kind}: {len(waiting)} models never answered")
            for name in list(waiting):
                try:
                    response = client.post(f"{server.url}/predictions/{name}", content=payload)
                except httpx.HTTPError:
                    break  # not listening yet
                if response.status_code == 200:
                    waiting.remove(name)
            else:
                continue
            time.sleep(0.2)  # the server is not up yet: poll again shortly
    return time.monotonic() - server.launched


# --- 1. resident -------------------------------------------------------------------------


@dataclass
class Resident:
    seconds: list[float] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    pss: list[int] = field(default_factory=list)


def resident_round(
    kind: str, folder: Path, store: Path, names: list[str], archive: str, payload: bytes
) -> tuple[float, int, int]:
    with launch(kind, folder, store, names, archive) as server:
        seconds = answer_all(server, names, payload)
        time.sleep(2)  # let the last loads' transient allocations settle before measuring
        return seconds, len(server.processes()), server.pss_bytes()


# --- 2. hot model ------------------------------------------------------------------------


def hot_model(
    folder: Path,
    store: Path,
    names: list[str],
    archive: str,
    payloads: list[bytes],
    rounds: int,
    requests: int,
) -> dict[str, list[tuple[float, float]]]:
    """Throughput and p50 of ``names[0]`` at concurrency 1 and 2: alone, and shared."""
    figures: dict[str, list[tuple[float, float]]] = {}
    with (
        launch(
            "ferry", folder / "alone", store, names[:1], archive, share_worker_processes="never"
        ) as alone,
        launch(
            "ferry", folder / "shared", store, names, archive, share_worker_processes="always"
        ) as shared,
    ):
        for server in (alone, shared):
            answer_all(server, names[:1] if server is alone else names, payloads[0])
        for index in range(rounds):
            order = [("alone", alone), ("shared", shared)]
            for label, server in order if index % 2 == 0 else reversed(order):
                for concurrency in (1, 2):
                    url = f"{server.url}/predictions/{names[0]}"
                    closed_loop(url, payloads, concurrency, 4, "image/jpeg")
                    result = closed_loop(url, payloads, concurrency, requests, "image/jpeg")
                    key = f"{label} c{concurrency}"
                    figures.setdefault(key, []).append((result.throughput, result.latency_ms(50)))
                    print(
                        f"hot model {key}: {result.throughput:.1f} req/s, "
                        f"p50 {result.latency_ms(50):.1f} ms",
                        flush=True,
                    )
    return figures


# --- 3. on demand ------------------------------------------------------------------------

LOADED = re.compile(r"(\S+) v\S+ loaded on demand in ([\d.]+) s")


def zipf_weights(count: int, exponent: float) -> list[float]:
    return [1 / (rank**exponent) for rank in range(1, count + 1)]


def model_class(rank: int) -> str:
    return "hot" if rank < 3 else "warm" if rank < 20 else "cold"


@dataclass
class OnDemandRun:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    memory: list[tuple[float, int]] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    lone_loads: list[float] = field(default_factory=list)
    footprint: int = 0
    budget_mb: int = 0
    evictions: int = 0
    requests: int = 0

    @property
    def peak_pss(self) -> int:
        return max((pss for _, pss in self.memory), default=0)


async def open_loop(
    server: Server,
    names: list[str],
    payloads: list[bytes],
    rate: float,
    seconds: float,
    exponent: float,
    run: OnDemandRun,
) -> None:
    rng = random.Random(7)
    weights = zipf_weights(len(names), exponent)
    order = list(range(len(names)))
    rng.shuffle(order)  # popularity independent of the name's position
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=500)) as client:

        async def one(rank: int, payload: bytes) -> None:
            started = time.perf_counter()
            try:
                response = await client.post(
                    f"{server.url}/predictions/{names[order[rank]]}", content=payload
                )
                status = response.status_code
            except httpx.HTTPError:
                status = 0
            run.statuses[status] = run.statuses.get(status, 0) + 1
            if status == 200:
                run.latencies.setdefault(model_class(rank), []).append(
                    (time.perf_counter() - started) * 1000
                )

        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        for offset in poisson_offsets(rate, rng):
            if offset > seconds:
                break
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            rank = rng.choices(range(len(names)), weights)[0]
            tasks.append(asyncio.create_task(one(rank, payloads[len(tasks) % len(payloads)])))
        run.requests = len(tasks)
        await asyncio.gather(*tasks)


def sample_memory(server: Server, run: OnDemandRun, stop: threading.Event) -> None:
    start = time.monotonic()
    while not stop.wait(1.0):
        run.memory.append((time.monotonic() - start, server.pss_bytes()))


def sampled_open_loop(
    server: Server,
    names: list[str],
    payloads: list[bytes],
    rate: float,
    seconds: float,
    exponent: float,
    run: OnDemandRun,
) -> None:
    """``open_loop`` into ``run``, the server's PSS sampled every second meanwhile."""
    stop = threading.Event()
    sampler = threading.Thread(target=sample_memory, args=(server, run, stop))
    sampler.start()
    try:
        asyncio.run(open_loop(server, names, payloads, rate, seconds, exponent, run))
    finally:
        stop.set()
        sampler.join()


def zipf_resident(
    kind: str,
    folder: Path,
    store: Path,
    names: list[str],
    archive: str,
    payloads: list[bytes],
    rate: float,
    seconds: float,
    exponent: float,
) -> OnDemandRun:
    """Every model resident, the same Zipf load as the on-demand part (same seed)."""
    run = OnDemandRun()
    with launch(kind, folder, store, names, archive) as server:
        answer_all(server, names, payloads[0])
        sampled_open_loop(server, names, payloads, rate, seconds, exponent, run)
    return run


def class_rows(run: OnDemandRun, label: str) -> list[str]:
    rows = []
    for name in ("hot", "warm", "cold"):
        values = run.latencies.get(name, [])
        rows.append(
            f"| {label} | {name} | {len(values)} | {percentile(values, 50):.0f} ms | "
            f"{percentile(values, 99):.0f} ms |"
        )
    return rows


def on_demand(
    folder: Path,
    store: Path,
    names: list[str],
    archive: str,
    payloads: list[bytes],
    hold: int,
    rate: float,
    seconds: float,
    exponent: float,
) -> OnDemandRun:
    run = OnDemandRun()
    # The footprint, measured: one model loaded on demand on a server with no budget.
    with launch(
        "ferry", folder / "probe", store, names[:4], archive, load_models_on_demand="true"
    ) as probe:
        answer_all(probe, names[:1], payloads[0])  # starts the shared process too
        for name in names[1:4]:  # a lone load each, into the running process
            answer_all(probe, [name], payloads[0])
        with httpx.Client(timeout=60) as client:
            described = client.get(f"{probe.management_url}/models/{names[1]}").json()[0]
        run.footprint = int(described["workers"][0]["modelMemory"])
        run.lone_loads = [float(m.group(2)) for m in LOADED.finditer(probe.log_path.read_text())][
            1:
        ]
    run.budget_mb = max(1, (hold * run.footprint) >> 20)
    with launch(
        "ferry",
        folder / "zipf",
        store,
        names,
        archive,
        load_models_on_demand="true",
        model_memory_budget_mb=str(run.budget_mb),
    ) as server:
        answer_all(server, names[:1], payloads[0])  # the server is up, its shared process too
        sampled_open_loop(server, names, payloads, rate, seconds, exponent, run)
        log = server.log_path.read_text()
        run.loads = [float(m.group(2)) for m in LOADED.finditer(log)][1:]
        run.evictions = log.count("evicted (least recently used)")
    return run


# --- the report --------------------------------------------------------------------------


def resident_row(label: str, figures: Resident) -> str:
    med = statistics.median
    return (
        f"| {label} | {med(figures.seconds):.1f} s | {med(figures.processes):.0f} | "
        f"{med(figures.pss) / MB:,.0f} MB |"
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/many_models.md"))
    parser.add_argument("--models", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hot-requests", type=int, default=150)
    parser.add_argument("--on-demand-models", type=int, default=100)
    parser.add_argument("--hold", type=int, default=10, help="models the budget holds")
    parser.add_argument("--rate", type=float, default=4.0, help="requests/s of the Zipf run")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--zipf", type=float, default=1.1, help="the Zipf exponent")
    parser.add_argument("--parts", default="resident,hot,zipf,on-demand")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="ferry-many-models-"))
    store = tmp / "store"
    store.mkdir()
    archive = ts_style_resnet18_archive(store, batch_size=1, max_batch_delay_ms=10)
    payloads = jpeg_inputs(16, 480)
    names = [f"m{index:03d}" for index in range(max(args.models, args.on_demand_models))]
    lines = [
        "# Many models on one machine",
        "",
        f"Machine: {machine_description()}.",
        "",
        f"`{' '.join(sys.argv)}` ({time.strftime('%Y-%m-%d')}). ResNet-18 (random weights, "
        "TorchScript) behind the TorchServe-style handler both servers run, registered under "
        "distinct names from one archive.",
        "",
    ]
    if "resident" in parts:
        results = {"ferry": Resident(), "torchserve": Resident()}
        kinds = ["ferry", "torchserve"]
        for index in range(args.rounds):
            for kind in kinds if index % 2 == 0 else reversed(kinds):
                seconds, processes, pss = resident_round(
                    kind, tmp / f"{kind}-{index}", store, names[: args.models], archive, payloads[0]
                )
                print(
                    f"{kind}: all {args.models} answered after {seconds:.1f} s, "
                    f"{processes} processes, PSS {pss / MB:.0f} MB",
                    flush=True,
                )
                results[kind].seconds.append(seconds)
                results[kind].processes.append(processes)
                results[kind].pss.append(pss)
        med = statistics.median
        ferry, ts = results["ferry"], results["torchserve"]
        lines += [
            f"## {args.models} models resident and answering",
            "",
            f"One worker each, every model asked once; medians of {args.rounds} rounds (which "
            "server goes first alternates). Ferry with its defaults "
            "(`share_worker_processes=auto`).",
            "",
            "| server | time until all answered | processes | PSS of the whole server |",
            "|---|---|---|---|",
            resident_row("TorchServe 0.12", ts),
            resident_row("Ferry", ferry),
            f"| Ferry / TorchServe | {med(ferry.seconds) / med(ts.seconds):.2f} | | "
            f"{med(ferry.pss) / med(ts.pss):.2f} |",
            "",
            "Every round: "
            + "; ".join(
                f"{kind} {r.seconds[i]:.1f} s {r.pss[i] / MB:,.0f} MB"
                for i in range(args.rounds)
                for kind, r in results.items()
            )
            + ".",
            "",
        ]
    if "hot" in parts:
        figures = hot_model(
            tmp / "hot",
            store,
            names[: args.models],
            archive,
            payloads,
            args.rounds,
            args.hot_requests,
        )
        med = statistics.median
        lines += [
            "## A hot model beside idle ones",
            "",
            f"`{names[0]}` under closed-loop load, alone in a process of its own, and in a shared "
            f"process beside {args.models - 1} idle models (`share_worker_processes=always`); "
            f"{args.hot_requests} requests a round, medians of {args.rounds} rounds.",
            "",
            "| concurrency | alone req/s | shared req/s | ratio | alone p50 | shared p50 | ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for concurrency in (1, 2):
            alone = figures[f"alone c{concurrency}"]
            shared = figures[f"shared c{concurrency}"]
            a_rate, s_rate = med(f[0] for f in alone), med(f[0] for f in shared)
            a_p50, s_p50 = med(f[1] for f in alone), med(f[1] for f in shared)
            lines.append(
                f"| {concurrency} | {a_rate:.1f} | {s_rate:.1f} | {s_rate / a_rate:.2f} | "
                f"{a_p50:.1f} ms | {s_p50:.1f} ms | {s_p50 / a_p50:.2f} |"
            )
        lines.append("")
    resident_zipf: OnDemandRun | None = None
    if "zipf" in parts:
        runs = {}
        for kind in ("torchserve", "ferry"):
            runs[kind] = zipf_resident(
                kind,
                tmp / f"zipf-{kind}",
                store,
                names[: args.models],
                archive,
                payloads,
                args.rate,
                args.seconds,
                args.zipf,
            )
            print(f"zipf {kind}: {dict(runs[kind].statuses)}", flush=True)
        resident_zipf = runs["ferry"]
        lines += [
            f"## {args.models} models resident under Zipf load",
            "",
            f"The same {args.models} models, all resident, the same open loop as the on-demand "
            f"part below ({args.rate:g} requests/s, Poisson, Zipf exponent {args.zipf:g}, "
            f"{args.seconds:.0f} s, the same seed).",
            "",
            "| server | class | requests answered | p50 | p99 |",
            "|---|---|---|---|---|",
            *class_rows(runs["torchserve"], "TorchServe 0.12"),
            *class_rows(runs["ferry"], "Ferry"),
            "",
            "Statuses: "
            + "; ".join(
                f"{kind} {dict(sorted(run.statuses.items()))}" for kind, run in runs.items()
            )
            + ". PSS peak: "
            + "; ".join(f"{kind} {run.peak_pss / MB:,.0f} MB" for kind, run in runs.items())
            + ".",
            "",
        ]
    if "on-demand" in parts:
        run = on_demand(
            tmp / "on-demand",
            store,
            names[: args.on_demand_models],
            archive,
            payloads,
            args.hold,
            args.rate,
            args.seconds,
            args.zipf,
        )
        errors = sum(count for status, count in run.statuses.items() if status != 200)
        peak = run.peak_pss
        lines += [
            f"## {args.on_demand_models} models on demand, a budget that holds {args.hold}",
            "",
            f"`load_models_on_demand=true`, `model_memory_budget_mb={run.budget_mb}` "
            f"({args.hold} x the {run.footprint / MB:.0f} MB a model measured at its load). "
            f"{run.requests} requests "
            f"over {args.seconds:.0f} s, Poisson at {args.rate:g}/s, models by Zipf popularity "
            f"(exponent {args.zipf:g}).",
            "",
            "| run | class | requests answered | p50 | p99 |",
            "|---|---|---|---|---|",
            *class_rows(run, f"{args.on_demand_models} on demand"),
            *(class_rows(resident_zipf, f"{args.models} resident") if resident_zipf else []),
        ]
        lines += [
            "",
            f"Statuses: {dict(sorted(run.statuses.items()))} ({errors} not 200). Loads on demand: "
            f"{len(run.loads)}, evictions: {run.evictions}. "
            f"Load time p50 {percentile(run.loads, 50):.2f} s "
            f"against a lone model's {statistics.median(run.lone_loads):.2f} s "
            f"(ratio {percentile(run.loads, 50) / statistics.median(run.lone_loads):.2f}); "
            f"server PSS peak {peak / MB:,.0f} MB, "
            "every 10 s: " + ", ".join(f"{pss / MB:,.0f}" for t, pss in run.memory[::10]) + " MB.",
            "",
        ]
    publish(args.out, lines)


if __name__ == "__main__":
    main()
