"""Mixed-protocol load with faults: does every request get an answer?

One Ferry server, one no-op model (batch 8), loaded at once over TorchServe REST, the
Open Inference Protocol over REST, TorchServe gRPC ``Predictions`` and the Open Inference
Protocol over gRPC ``ModelInfer`` (closed loop, the same number of clients each), while:

- the model's worker is killed with SIGKILL ``--kills`` times, evenly spread in the run;
- a hostile client posts JSON nested 100,000 deep (200 KB) ``--poison-per-second`` times
  a second to the same model (issue 29: it used to kill the worker every time, and its
  batch-mates were re-run with it).

With the newer paths (on by default; ``--no-new-paths`` leaves them out): two models loaded
on demand, registered with no workers and evicting each other under a memory budget, and
a ``torch.compile`` model whose answers are checked (``benchmarks/fault_models.py``), each
loaded by TorchServe REST clients while the compiled model's worker and the on-demand
models' shared process are SIGKILLed ``--kills`` times too.

Reported per protocol: requests sent, answered (any status came back), non-2xx (HTTP
status, or a gRPC code other than OK), wrong answers, hung (no answer within the client's
60 s timeout) and transport errors; the poison's statuses; the frontend's and the worker's
resident memory before the load (after a warm-up) and after it.

    python benchmarks/fault_load.py                          # 120 s, 2 clients a protocol
    python benchmarks/fault_load.py --seconds 10 --out /tmp/fault_load.md   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import httpx

import ferry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import fault_models
from benchmarks.common import ROOT, machine_description, publish
from benchmarks.protocols_benchmark import (
    REQUEST_TIMEOUT,
    BadAnswer,
    Client,
    TorchServeGrpc,
    TorchServeRest,
    V2Grpc,
    V2Rest,
    Workload,
    first_answer,
    noop_workload,
)
from benchmarks.server import BenchmarkServer, ferry_server

POISON = b"[" * 100_000 + b"]" * 100_000


@dataclass
class Tally:
    """What one protocol's clients saw."""

    sent: int = 0
    answered: int = 0
    non_2xx: Counter[str] = field(default_factory=Counter)
    wrong: Counter[str] = field(default_factory=Counter)
    hung: int = 0
    transport: Counter[str] = field(default_factory=Counter)


def classify(tally: Tally, error: BaseException | None) -> None:
    """Count one request's outcome: ``error`` is what ``Client.call`` raised, if anything."""
    tally.sent += 1
    if error is None:
        tally.answered += 1
    elif isinstance(error, grpc.aio.AioRpcError):
        if error.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
            tally.hung += 1
        elif error.code() is grpc.StatusCode.UNAVAILABLE and "connect" in (error.details() or ""):
            tally.transport[f"gRPC UNAVAILABLE: {(error.details() or '')[:60]}"] += 1
        else:
            tally.answered += 1
            tally.non_2xx[f"gRPC {error.code().name}"] += 1
    elif isinstance(error, BadAnswer) and str(error).startswith("HTTP "):
        tally.answered += 1
        tally.non_2xx[str(error)] += 1
    elif isinstance(error, BadAnswer):
        tally.answered += 1
        tally.wrong[str(error)[:60]] += 1
    elif isinstance(error, TimeoutError):
        tally.hung += 1
    else:
        tally.transport[f"{type(error).__name__}: {str(error)[:60]}"] += 1


async def load(client: Client, tally: Tally, deadline: float) -> None:
    index = 0
    while time.monotonic() < deadline:
        index += 1
        try:
            await client.call(index)
        except Exception as error:  # every outcome is counted, none hidden
            classify(tally, error)
        else:
            classify(tally, None)


async def poison(url: str, per_second: float, deadline: float, statuses: Counter[str]) -> None:
    if per_second <= 0:
        return
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                async with session.post(url, data=POISON, headers=headers) as response:
                    await response.read()
                    statuses[f"HTTP {response.status}"] += 1
            except Exception as error:  # counted like any other outcome
                statuses[type(error).__name__] += 1
            await asyncio.sleep(max(0.0, 1 / per_second - (time.monotonic() - started)))


def worker_pid(server: BenchmarkServer, model: str, wait: float = 120.0) -> int:
    """The model's worker's pid, once it has one (a replacement may still be starting)."""
    deadline = time.monotonic() + wait
    while True:
        answer = httpx.get(f"{server.management_url}/models/{model}", timeout=60).json()
        pid = answer[0]["workers"][0]["pid"] if answer[0]["workers"] else None
        if pid is not None:
            return int(pid)
        if time.monotonic() > deadline:
            raise RuntimeError(f"model {model} has had no running worker for {wait:g} s")
        time.sleep(0.1)  # polling the management API while the worker starts


def status_mib(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of ``/proc/PID/status`` (``VmRSS`` now, ``VmHWM`` at its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def kill_workers(
    server: BenchmarkServer, models: tuple[str, ...], times: list[float], killed: list[int]
) -> None:
    """At each of ``times``, SIGKILL the worker of whichever of ``models`` has one (the
    first that does; models loaded on demand may have none at that moment)."""
    for at in times:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        pid = await asyncio.to_thread(resident_worker_pid, server, models)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)


def resident_worker_pid(server: BenchmarkServer, models: tuple[str, ...]) -> int:
    deadline = time.monotonic() + 120.0
    while True:
        for model in models:
            answer = httpx.get(f"{server.management_url}/models/{model}", timeout=60).json()
            workers = [w for w in answer[0]["workers"] if w.get("pid")]
            if workers:
                return int(workers[0]["pid"])
        if time.monotonic() > deadline:
            raise RuntimeError(f"none of {models} has had a running worker for 120 s")
        time.sleep(0.1)  # polling the management API while a worker starts


def metric_total(server: BenchmarkServer, name: str) -> float:
    """The sum of a counter's series in the server's metrics."""
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=60).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


@dataclass
class Outcome:
    tallies: dict[str, Tally]
    poison: Counter[str]
    killed: list[int]
    rss_before: tuple[float, float]
    rss_after: tuple[float, float]
    seconds: float
    killed_new_paths: dict[str, list[int]] = field(default_factory=dict)
    loads_and_evictions: tuple[float, float] = (0.0, 0.0)


async def run(server: BenchmarkServer, args: argparse.Namespace, workload: Workload) -> Outcome:
    clients: list[Client] = []
    for copy in range(args.clients_per_protocol):
        clients += [
            TorchServeRest(f"TorchServe REST #{copy}", workload, server.url),
            V2Rest(f"V2 REST #{copy}", workload, server.url),
            TorchServeGrpc(f"TorchServe gRPC #{copy}", workload, server.grpc_target),
            V2Grpc(f"V2 gRPC #{copy}", workload, server.grpc_target),
        ]
        if args.new_paths:
            clients += new_path_clients(server, args.store, copy)
    try:
        for client in clients:
            await first_answer(client, 120)
        # Warm-up: a few hundred requests per client before memory is read.
        warm = time.monotonic() + args.warmup
        await asyncio.gather(*(load(c, Tally(), warm) for c in clients))
        before = (status_mib(server.pid), status_mib(worker_pid(server, workload.model)))
        start = time.monotonic()
        deadline = start + args.seconds
        tallies = {c.name.split(" #")[0]: Tally() for c in clients}
        poisons: Counter[str] = Counter()
        killed: list[int] = []
        kill_times = [start + args.seconds * (k + 1) / (args.kills + 1) for k in range(args.kills)]
        extra: dict[str, list[int]] = {"compiled": [], "on demand": []}
        killers = [kill_workers(server, (workload.model,), kill_times, killed)]
        if args.new_paths:
            # Offset from the no-op's kills: one fault at a time is easier to read.
            later = [at + args.seconds / (3 * (args.kills + 1)) for at in kill_times]
            latest = [at + 2 * args.seconds / (3 * (args.kills + 1)) for at in kill_times]
            killers += [
                kill_workers(server, ("affine",), later, extra["compiled"]),
                kill_workers(server, fault_models.ON_DEMAND, latest, extra["on demand"]),
            ]
        await asyncio.gather(
            *(load(c, tallies[c.name.split(" #")[0]], deadline) for c in clients),
            poison(f"{server.url}/predictions/{workload.model}", args.poison, deadline, poisons),
            *killers,
        )
        seconds = time.monotonic() - start
        after = (status_mib(server.pid), status_mib(worker_pid(server, workload.model)))
        loads = metric_total(server, "ferry_model_loads_total")
        evictions = metric_total(server, "ferry_model_evictions_total")
        return Outcome(tallies, poisons, killed, before, after, seconds, extra, (loads, evictions))
    finally:
        for client in clients:
            await client.close()


def new_path_clients(server: BenchmarkServer, store: Path, copy: int) -> list[Client]:
    compiled = fault_models.affine_workload(store, "affine.mar")
    on_demand = fault_models.on_demand_client(
        f"on demand (TorchServe REST) #{copy}", store, ["od0.mar", "od1.mar"], server.url
    )
    return [TorchServeRest(f"compiled (TorchServe REST) #{copy}", compiled, server.url), on_demand]


def register_on_demand(server: BenchmarkServer, archives: list[str]) -> None:
    """As issue 47 found them: registered with no ``initial_workers``."""
    for archive in archives:
        answer = httpx.post(f"{server.management_url}/models", params={"url": archive}, timeout=60)
        answer.raise_for_status()


def report(outcome: Outcome, args: argparse.Namespace, revision: str) -> list[str]:
    total = Tally()
    lines = [
        "# Mixed-protocol load with worker kills and poison requests",
        "",
        f"Machine: {machine_description()}.",
        f"Ferry at {revision}; `python benchmarks/fault_load.py --seconds {args.seconds:g} "
        f"--clients-per-protocol {args.clients_per_protocol} --kills {args.kills} "
        f"--poison-per-second {args.poison:g}{'' if args.new_paths else ' --no-new-paths'}`.",
        "",
        f"{len(outcome.tallies) * args.clients_per_protocol} closed-loop clients for "
        f"{outcome.seconds:.0f} s on a no-op model (batch 8); the worker was SIGKILLed "
        f"{len(outcome.killed)} times; a hostile client posted JSON nested 100,000 deep "
        f"{sum(outcome.poison.values())} times.",
        "",
        *_new_paths_said(outcome, args),
        "| protocol | sent | answered | non-2xx | wrong answers | hung | transport errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, tally in outcome.tallies.items():
        lines.append(_row(name, tally))
        total.sent += tally.sent
        total.answered += tally.answered
        total.non_2xx.update(tally.non_2xx)
        total.wrong.update(tally.wrong)
        total.hung += tally.hung
        total.transport.update(tally.transport)
    lines.append(_row("**all**", total))
    details = {**total.non_2xx, **total.wrong, **total.transport}
    if details:
        lines += ["", "What did not succeed: " + _counts(Counter(details)) + "."]
    before, after = outcome.rss_before, outcome.rss_after
    lines += [
        "",
        f"Poison requests: {_counts(outcome.poison) or 'none sent'}.",
        "",
        "| resident memory (MiB) | before the load | after |",
        "|---|---:|---:|",
        f"| frontend | {before[0]:.0f} | {after[0]:.0f} |",
        f"| worker (after: its last replacement) | {before[1]:.0f} | {after[1]:.0f} |",
    ]
    return lines


def _new_paths_said(outcome: Outcome, args: argparse.Namespace) -> list[str]:
    if not args.new_paths:
        return []
    loads, evictions = outcome.loads_and_evictions
    killed = outcome.killed_new_paths
    return [
        f"The newer paths, beside it: `affine`, compiled with `torch.compile` (its worker "
        f"SIGKILLed {len(killed['compiled'])} times, each answer checked against 2x + 1); "
        f"`od0` and `od1`, loaded on demand (registered with no workers, "
        f"{fault_models.BALLAST_MB} MB each, a budget of {fault_models.BUDGET_MB} MB; their "
        f"shared process SIGKILLed {len(killed['on demand'])} times): {loads:.0f} loads on "
        f"demand, {evictions:.0f} evictions.",
        "",
    ]


def _row(name: str, tally: Tally) -> str:
    return (
        f"| {name} | {tally.sent} | {tally.answered} | {sum(tally.non_2xx.values())} | "
        f"{sum(tally.wrong.values())} | {tally.hung} | {sum(tally.transport.values())} |"
    )


def _counts(counts: Counter[str]) -> str:
    return ", ".join(f"{what}: {count}" for what, count in counts.most_common())


def revision() -> str:
    """The commit of the checkout Ferry is imported from, as ``git`` names it (``+`` when
    files differ from it)."""
    git = ["git", "-C", str(Path(ferry.__file__).resolve().parents[1])]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    return (head.stdout.strip() or "unknown") + ("+" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--clients-per-protocol", type=int, default=2)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--poison-per-second", dest="poison", type=float, default=1.0)
    parser.add_argument(
        "--no-new-paths",
        dest="new_paths",
        action="store_false",
        help="only the no-op model (no models loaded on demand, no compiled model)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/fault_load.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        store = tmp / "store"
        store.mkdir()
        args.store = store
        workload = noop_workload(store)
        models = [f"{workload.model}={workload.archive.name}"]
        flags = ["--access-log", "false"]
        on_demand: list[str] = []
        if args.new_paths:
            models.append(f"affine={fault_models.affine_archive(store)}")
            on_demand = fault_models.on_demand_archives(store)
            flags += ["--enable-model-api"]
            flags += ["--model-memory-budget-mb", str(fault_models.BUDGET_MB)]
        with ferry_server(store, models, tmp, *flags) as server:
            register_on_demand(server, on_demand)
            outcome = asyncio.run(run(server, args, workload))
    publish(args.out, report(outcome, args, revision()))


if __name__ == "__main__":
    main()
