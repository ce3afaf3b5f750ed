"""What tracing costs: the same server with ``enable_tracing`` off, on with every request
sampled, on with 10% sampled (spans exported over OTLP, gRPC or HTTP, to a collector
stand-in in a process of its own), and on with every request recorded but not exported,
side by side in one run.

    python benchmarks/tracing_overhead.py [--rounds 4] [--seconds 8] [--protocol grpc]

Four servers from this tree, started anew every round, one worker each: the no-op
handler (the server's own cost per request) and ResNet-18 (TorchScript, the built-in
image_classifier, 224x224 JPEGs), batches of up to 8 within 5 ms (no-op) / 10 ms
(ResNet-18), 16 clients, closed loop. Rounds alternate which server goes first; medians
and ratios go to ``benchmarks/results/tracing_overhead.md`` with the spans the collector
received and the spans the servers dropped, and where the CPU went: each process's CPU
time (``/proc``) during each no-op measurement, per request answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

import httpx

from benchmarks.common import (
    ROOT,
    jpeg_inputs,
    machine_description,
    noop_archive,
    publish,
    resnet18_archive,
)
from benchmarks.server import ferry_server
from ferry.procinfo import cpu_seconds, descendants
from ferry_bench.load import LoadResult, LoadSpec, run_load

SINK = Path(__file__).with_name("otlp_sink.py")
SINK_NICENESS = 10
"""The collector stand-in yields the CPU: in production a collector has cores of its own."""
RESULTS = ROOT / "benchmarks" / "results"
CLIENTS = 16
SERVERS = ("tracing off", "tracing on", "tracing on, 10% sampled", "tracing on, not exported")
"""The last records every request's spans and drops them (``OTEL_TRACES_EXPORTER=none``):
the server's own share of the cost, without an exporter and collector on its cores."""


@dataclass(frozen=True)
class Collector:
    url: str
    counts: Path
    """The file it counts the spans it received into."""
    pid: int


@contextlib.contextmanager
def collector(work: Path, protocol: str) -> Iterator[Collector]:
    """The OTLP stand-in (``otlp_sink.py``) for ``protocol``."""
    ready, counts = work / "sink.json", work / "sink-counts.json"
    grpc = ["--grpc"] if protocol == "grpc" else []
    command = [
        sys.executable,
        str(SINK),
        *grpc,
        "--nice",
        str(SINK_NICENESS),
        str(ready),
        str(counts),
    ]
    process = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the OTLP sink did not start")
            time.sleep(0.05)  # polling the file the sink writes once it listens
        yield Collector(json.loads(ready.read_text())["url"], counts, process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def load(url: str, payloads: list[bytes], seconds: float) -> LoadResult:
    asyncio.run(run_load(LoadSpec(url, payloads, concurrency=CLIENTS, requests=4 * CLIENTS)))
    result = asyncio.run(run_load(LoadSpec(url, payloads, concurrency=CLIENTS, duration=seconds)))
    if result.failed:
        raise RuntimeError(f"{result.failed} requests to {url} failed")
    return result


CPU_ROLES = ("server", "worker", "exporter", "collector stand-in", "load generator")


def _roles(server_pid: int, collector_pid: int) -> dict[int, str]:
    """The processes whose CPU a measurement counts: the server, the processes it started
    (its worker, its exporter process), the collector stand-in and this process (the load
    generator)."""
    roles = {
        server_pid: "server",
        collector_pid: "collector stand-in",
        os.getpid(): "load generator",
    }
    for pid in descendants(server_pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # it ended
        roles[pid] = "exporter" if b"export_process" in command else "worker"
    return roles


def _cpu_by_role(roles: dict[int, str]) -> dict[str, float]:
    spent = dict.fromkeys(CPU_ROLES, 0.0)
    for pid, role in roles.items():
        spent[role] += cpu_seconds(pid)
    return spent


def dropped_spans(metrics_url: str) -> float:
    text = httpx.get(f"{metrics_url}/metrics", timeout=60).text
    for line in text.splitlines():
        if line.startswith("ferry_trace_spans_dropped_total"):
            return float(line.split()[-1])
    return 0.0


def measure(
    rounds: int, seconds: float, protocol: str
) -> tuple[dict[str, list[float]], dict[str, float], dict[str, dict[str, list[float]]]]:
    """Requests/s per round by model and server; the spans received and dropped; the
    no-op's CPU microseconds per request by server and process role, per round."""
    figures: dict[str, list[float]] = {}
    cpu: dict[str, dict[str, list[float]]] = {name: {} for name in SERVERS}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        store = work / "store"
        noop_archive(store, 8)
        resnet18_archive(store, 8, 10)
        sink = stack.enter_context(collector(work, protocol))
        traced = {
            "FERRY_ENABLE_TRACING": "true",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
        }
        sampled = {
            **traced,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
        }
        not_exported = {"FERRY_ENABLE_TRACING": "true", "OTEL_TRACES_EXPORTER": "none"}
        environments = {
            "tracing off": {},
            "tracing on": traced,
            SERVERS[2]: sampled,
            SERVERS[3]: not_exported,
        }
        models = ["noop=noop.mar", "resnet18=resnet18.mar"]
        payloads = {"noop": [b"x"], "resnet18": jpeg_inputs(16, 224)}
        dropped = 0.0
        for index in range(rounds):
            shift = index % len(SERVERS)  # each server goes first in turn
            order = list(SERVERS[shift:] + SERVERS[:shift])
            # New servers every round: one process serves the no-op faster or slower than
            # another of the same code for its whole life (its memory layout, its hash
            # seed), by as much as tracing costs; rounds of new processes average that out.
            with contextlib.ExitStack() as round_servers:
                servers = {
                    name: round_servers.enter_context(
                        ferry_server(store, models, work, environment=environments[name])
                    )
                    for name in order
                }
                for model in payloads:
                    for name in order:
                        url = f"{servers[name].url}/predictions/{model}"
                        roles = _roles(servers[name].pid, sink.pid)
                        before = _cpu_by_role(roles)
                        result = load(url, payloads[model], seconds)
                        after = _cpu_by_role(roles)
                        rate = result.throughput
                        figures.setdefault(f"{model} | {name}", []).append(rate)
                        if model == "noop":
                            for role in CPU_ROLES:
                                per_request = (after[role] - before[role]) / result.requests * 1e6
                                cpu[name].setdefault(role, []).append(per_request)
                        print(f"round {index + 1} {model} {name}: {rate:.1f} req/s", flush=True)
                dropped += sum(dropped_spans(servers[name].metrics_url) for name in SERVERS[1:])
            # The servers have exited, each sending the spans it held first.
        spans = {
            "dropped": dropped,
            "received": float(json.loads(sink.counts.read_text())["spans"])
            if sink.counts.exists()
            else 0,
        }
    return figures, spans, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--protocol",
        choices=("grpc", "http/protobuf"),
        default="grpc",
        help="OTLP's transport (OpenTelemetry's default: grpc)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "tracing_overhead.md")
    args = parser.parse_args()
    figures, spans, cpu = measure(args.rounds, args.seconds, args.protocol)
    rows = []
    for model, label in (("noop", "no-op"), ("resnet18", "ResNet-18")):
        off = statistics.median(figures[f"{model} | tracing off"])
        on = statistics.median(figures[f"{model} | tracing on"])
        sampled = statistics.median(figures[f"{model} | {SERVERS[2]}"])
        recorded = statistics.median(figures[f"{model} | {SERVERS[3]}"])
        rounds = ", ".join(f"{r:.0f}" for r in figures[f"{model} | tracing on"])
        rows.append(
            f"| {label} | {off:.1f} | {on:.1f} | {on / off:.3f} | {sampled:.1f} | "
            f"{sampled / off:.3f} | {recorded:.1f} | {recorded / off:.3f} | {rounds} |"
        )
    publish(
        args.out,
        [
            "# What tracing costs",
            "",
            f"Machine: {machine_description()}; servers, collector stand-in and load "
            "generator share its cores.",
            f"Command: `python benchmarks/tracing_overhead.py --rounds {args.rounds} "
            f"--seconds {args.seconds:g} --protocol {args.protocol}`: four servers of this "
            "tree, `enable_tracing` off, on with every request sampled, on with 10% sampled "
            "(`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.1`), "
            "and on with every request recorded but not exported (`OTEL_TRACES_EXPORTER=none`: "
            "the server's own share, without the exporter process and collector on its cores); "
            f"OTLP over {args.protocol} to `benchmarks/otlp_sink.py`, which decodes and counts "
            f"(at niceness {SINK_NICENESS}: a collector has cores of its own); "
            f"{CLIENTS} clients, closed loop, new servers every round (a process's own speed "
            "varies by a few percent for its lifetime), each going first in turn, medians.",
            "",
            "| model | off (req/s) | on, every request (req/s) | on / off | on, 10% sampled "
            "(req/s) | sampled / off | on, not exported (req/s) | not exported / off | "
            "on, per round |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Spans the collector received from the two exporting servers: "
            f"{spans['received']:.0f}; spans they dropped "
            f"(`ferry_trace_spans_dropped_total`): {spans['dropped']:.0f}.",
            "",
            *_cpu_table(cpu),
        ],
    )


def _cpu_table(cpu: dict[str, dict[str, list[float]]]) -> list[str]:
    """Where the no-op's CPU went, per request: medians of the rounds."""
    medians = {
        name: {role: statistics.median(cpu[name][role]) for role in CPU_ROLES} for name in SERVERS
    }
    rows = [
        f"| {name} | "
        + " | ".join(f"{medians[name][role]:.1f}" for role in CPU_ROLES)
        + f" | {sum(medians[name].values()):.1f} |"
        for name in SERVERS
    ]
    return [
        "Where the CPU went, no-op model: each process's CPU time (user and system, from "
        "`/proc`) during each measurement, per request answered, in microseconds; medians "
        "of the rounds. On a machine where the collector has cores of its own, the server "
        "pays the server, worker and exporter columns.",
        "",
        "| tracing | " + " | ".join(CPU_ROLES) + " | total |",
        "|---|" + "---|" * (len(CPU_ROLES) + 1),
        *rows,
        "",
    ]


if __name__ == "__main__":
    main()
