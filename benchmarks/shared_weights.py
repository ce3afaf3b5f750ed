"""One copy of a model's weights (issue 53): a model of about 400 MB of fp32 weights served
with 1 and with 4 workers, its weights shared (the default) and not
(``optimization: share_weights: false``), as TorchScript and as an eager model (its
``modelFile`` and state dict); then a scale-up's new worker, and ResNet-18's throughput
with and without sharing.

Figures, all from one run, side by side:

- whole-server PSS (the frontend and every process under it, ``/proc/PID/smaps_rollup``)
  once every worker is ready and has answered, for each format, sharing and worker count;
- a scale-up from 1 worker to 2 (``PUT /models/NAME?min_worker=2&synchronous=true``, timed
  to its answer), rounds alternating sharing on and off;
- ResNet-18 (TorchScript, image_classifier) at 16 closed-loop clients, the two models in
  one server and their rounds alternating: req/s and p99 latency.

Usage: ``python benchmarks/shared_weights.py [--out benchmarks/results/shared_weights.md]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
import yaml
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    closed_loop,
    jpeg_inputs,
    machine_description,
    publish,
    resnet18_archive,
)
from benchmarks.many_models import pss
from benchmarks.server import BenchmarkServer, ferry_server
from ferry.procinfo import descendants
from ferry.store.writer import ArchiveSpec, write_archive
from ferry_bench.stats import percentile

ROOT = Path(__file__).resolve().parents[1]
HANDLER = ROOT / "tests" / "fixtures" / "handlers" / "weights_reporting_handler.py"
WIDTH, LAYERS = 2048, 24
"""24 linear layers of 2048 x 2048: 403 MB of fp32 weights."""
MODEL_FILE = f'''"""The benchmark's 403 MB model (benchmarks/shared_weights.py)."""
import torch
from torch import nn


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear({WIDTH}, {WIDTH}) for _ in range({LAYERS})])

    def forward(self, x):
        return self.layers(x)[:, :4]
'''
FORMATS = ("TorchScript", "eager")
MEBI = 1 << 20


@dataclass(frozen=True)
class Setup:
    label: str
    shared: bool
    """``optimization: share_weights``."""
    fork: bool
    """The server's ``fork_workers``."""

    @property
    def flags(self) -> tuple[str, ...]:
        return ("--fork-workers", "true" if self.fork else "false")


BEFORE = Setup("before: own copy, started afresh", shared=False, fork=False)
SETUPS = (
    BEFORE,
    Setup("weights shared, started afresh", shared=True, fork=False),
    Setup("weights shared, forked (the default)", shared=True, fork=True),
)


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out[:, :4]


@dataclass
class Figures:
    weights_bytes: int = 0
    pss: dict[tuple[str, Setup, int], float] = field(default_factory=dict)
    """(format, setup, workers) -> whole-server PSS in bytes."""
    scale_up: dict[tuple[str, Setup], list[float]] = field(default_factory=dict)
    throughput: dict[Setup, list[float]] = field(default_factory=dict)
    p99_ms: dict[Setup, list[float]] = field(default_factory=dict)


def write_archives(store: Path, work: Path) -> int:
    """The big model as TorchScript and as eager, each shared and not; its weights' bytes."""
    torch.manual_seed(0)
    model = Stack().eval()
    torch.save(model.state_dict(), work / "stack.pt")
    torch.jit.script(model).save(str(work / "stack-ts.pt"))  # type: ignore[no-untyped-call]
    (work / "stack_model.py").write_text(MODEL_FILE)
    for shared in (True, False):
        config = work / f"config-{shared}.yaml"
        body = {"minWorkers": 1, "maxWorkers": 8, "batchSize": 1, "responseTimeout": 300}
        config.write_text(yaml.safe_dump({**body, "optimization": {"share_weights": shared}}))
        for fmt in FORMATS:
            eager = fmt == "eager"
            spec = ArchiveSpec(
                archive_name(fmt, shared),
                str(HANDLER),
                serialized_file=work / ("stack.pt" if eager else "stack-ts.pt"),
                model_file=work / "stack_model.py" if eager else None,
                config_file=config,
            )
            write_archive(spec, store, force=True)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def archive_name(fmt: str, shared: bool) -> str:
    return f"{'eager' if fmt == 'eager' else 'ts'}-{'shared' if shared else 'private'}"


def server_pss(server: BenchmarkServer) -> int:
    return sum(pss(pid) for pid in [server.pid, *descendants(server.pid)])


def scale(server: BenchmarkServer, name: str, workers: int) -> float:
    """Seconds until ``PUT /models/NAME?min_worker=N&synchronous=true`` answers."""
    started = time.monotonic()
    response = httpx.put(
        f"{server.management_url}/models/{name}",
        params={"min_worker": workers, "max_worker": max(workers, 8), "synchronous": "true"},
        timeout=600,
    )
    response.raise_for_status()
    return time.monotonic() - started


def answer_each_worker(server: BenchmarkServer, name: str, workers: int) -> None:
    """Requests until every worker has answered: each has read all of its weights."""
    row = ",".join("0.5" for _ in range(WIDTH))
    seen: set[int] = set()
    for _ in range(50 * workers):
        response = httpx.post(f"{server.url}/predictions/{name}", content=f"[{row}]", timeout=300)
        response.raise_for_status()
        seen.add(response.json()["pid"])
        if len(seen) == workers:
            return
    raise RuntimeError(f"only {len(seen)} of {workers} workers of {name} answered")


@contextmanager
def serving(store: Path, tmp: Path, names: list[str], setup: Setup) -> Iterator[BenchmarkServer]:
    with ferry_server(store, [f"{name}={name}.mar" for name in names], tmp, *setup.flags) as server:
        yield server


def memory(store: Path, tmp: Path, figures: Figures) -> None:
    for fmt in FORMATS:
        for setup in SETUPS:
            name = archive_name(fmt, setup.shared)
            with serving(store, tmp, [name], setup) as server:
                for workers in (1, 4):
                    scale(server, name, workers)
                    answer_each_worker(server, name, workers)
                    figures.pss[(fmt, setup, workers)] = server_pss(server)
                    print(
                        f"{fmt}, {setup.label}, {workers} worker(s): "
                        f"{figures.pss[(fmt, setup, workers)] / MEBI:.0f} MiB",
                        flush=True,
                    )


def scale_ups(store: Path, tmp: Path, figures: Figures, rounds: int) -> None:
    """Each setup's server up at once, one model each, their scale-ups in turn."""
    for fmt in FORMATS:
        with ExitStack() as stack:
            servers = {}
            for setup in SETUPS:
                name = archive_name(fmt, setup.shared)
                servers[setup] = stack.enter_context(serving(store, tmp, [name], setup))
                answer_each_worker(servers[setup], name, 1)
            for index in range(rounds):
                order = SETUPS if index % 2 == 0 else SETUPS[::-1]
                for setup in order:
                    name = archive_name(fmt, setup.shared)
                    seconds = scale(servers[setup], name, 2)
                    scale(servers[setup], name, 1)
                    figures.scale_up.setdefault((fmt, setup), []).append(seconds)
                    print(f"{fmt}, {setup.label}: scale-up {seconds:.2f} s", flush=True)


def resnet_rounds(tmp: Path, figures: Figures, rounds: int, requests: int) -> None:
    """ResNet-18 served as before and as now, one server each, rounds alternating."""
    store = tmp / "resnet-store"
    store.mkdir()
    scratch = tmp / "resnet-src"
    scratch.mkdir()
    resnet18_archive(scratch, batch_size=8, max_batch_delay_ms=5)
    with zipfile.ZipFile(scratch / "resnet18.mar") as archive:
        (scratch / "resnet18.pt").write_bytes(archive.read("resnet18.pt"))
        config: dict[str, Any] = yaml.safe_load(archive.read("model-config.yaml"))
    for shared in (True, False):
        path = scratch / f"config-{shared}.yaml"
        path.write_text(yaml.safe_dump({**config, "optimization": {"share_weights": shared}}))
        spec = ArchiveSpec(
            resnet_name(shared),
            "image_classifier",
            serialized_file=scratch / "resnet18.pt",
            config_file=path,
        )
        write_archive(spec, store, force=True)
    payloads = jpeg_inputs(16, 224)
    compared = SETUPS
    with ExitStack() as stack:
        urls = {}
        for setup in compared:
            name = resnet_name(setup.shared)
            server = stack.enter_context(serving(store, tmp, [name], setup))
            urls[setup] = f"{server.url}/predictions/{name}"
            closed_loop(urls[setup], payloads, 16, 64, "image/jpeg")
        for index in range(rounds):
            for setup in compared if index % 2 == 0 else compared[::-1]:
                result = closed_loop(urls[setup], payloads, 16, requests, "image/jpeg")
                figures.throughput.setdefault(setup, []).append(result.throughput)
                figures.p99_ms.setdefault(setup, []).append(percentile(result.latencies_ms, 99))
                print(f"round {index + 1}, {setup.label}: {result.throughput:.1f} req/s")


def resnet_name(shared: bool) -> str:
    return f"r18-{'shared' if shared else 'private'}"


def page(figures: Figures, rounds: int, requests: int) -> list[str]:
    weights = figures.weights_bytes / MEBI
    lines = [
        "# One copy of a model's weights (issue 53)",
        "",
        f"Machine: {machine_description()}.",
        "Produced by `benchmarks/shared_weights.py` in one run. The model: "
        f"{LAYERS} linear layers of {WIDTH} x {WIDTH}, {weights:.0f} MiB of fp32 weights, "
        "behind a `BaseHandler` subclass (tests/fixtures/handlers/"
        "weights_reporting_handler.py). Three setups: each worker loading its own copy in "
        "a process started afresh, as before (`optimization: share_weights: false`, "
        "`--fork-workers false`); the weights shared, workers started afresh "
        "(`--fork-workers false`); and the weights shared by workers forked from one process "
        "that has imported torch (the default).",
        "",
        "## Whole-server memory (PSS: the frontend and every worker process)",
        "",
        "| format | setup | 1 worker | 4 workers | 4 / 1 | 4 workers / before's 1 |",
        "|---|---|---|---|---|---|",
    ]
    for fmt in FORMATS:
        before = figures.pss.get((fmt, BEFORE, 1))
        for setup in SETUPS:
            one = figures.pss.get((fmt, setup, 1))
            four = figures.pss.get((fmt, setup, 4))
            if one is None or four is None or before is None:
                continue
            lines.append(
                f"| {fmt} | {setup.label} | {one / MEBI:,.0f} MiB | {four / MEBI:,.0f} MiB | "
                f"{four / one:.2f}x | {four / before:.2f}x |"
            )
    lines += [
        "",
        "Every worker answered before the figure was read, so each has read all of its "
        "weights. PSS divides a page shared by N processes by N: one copy of the weights "
        "counts once across the workers that map it.",
        "",
        f"## A scale-up's new worker (1 -> 2 workers, `PUT ... synchronous=true`, median of "
        f"{rounds} alternating rounds)",
        "",
        "| format | setup | seconds | / before |",
        "|---|---|---|---|",
    ]
    for fmt in FORMATS:
        before_times = figures.scale_up.get((fmt, BEFORE))
        for setup in SETUPS:
            times = figures.scale_up.get((fmt, setup))
            if not times or not before_times:
                continue
            median = statistics.median(times)
            ratio = median / statistics.median(before_times)
            lines.append(f"| {fmt} | {setup.label} | {median:.2f} s | {ratio:.2f}x |")
    if all(figures.throughput.get(setup) for setup in SETUPS):
        rate = {s: statistics.median(figures.throughput[s]) for s in SETUPS}
        p99 = {s: statistics.median(figures.p99_ms[s]) for s in SETUPS}
        lines += [
            "",
            f"## ResNet-18 at 16 clients (medians of {rounds} alternating rounds of "
            f"{requests} requests, one server each)",
            "",
            "| setup | req/s | / before | p99 | / before |",
            "|---|---|---|---|---|",
            *(
                f"| {s.label} | {rate[s]:.1f} | {rate[s] / rate[BEFORE]:.3f}x | "
                f"{p99[s]:.0f} ms | {p99[s] / p99[BEFORE]:.2f}x |"
                for s in SETUPS
            ),
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/shared_weights.md")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="ResNet-18, per round")
    parser.add_argument(
        "--only", choices=("memory", "scale-up", "resnet"), help="one part (default: all)"
    )
    args = parser.parse_args()
    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="ferry-shared-weights-") as folder:
        tmp = Path(folder)
        store = tmp / "store"
        store.mkdir()
        (tmp / "src").mkdir()
        if args.only in (None, "memory", "scale-up"):
            figures.weights_bytes = write_archives(store, tmp / "src")
        if args.only in (None, "memory"):
            memory(store, tmp, figures)
            publish(args.out, page(figures, args.rounds, args.requests))
        if args.only in (None, "scale-up"):
            scale_ups(store, tmp, figures, args.rounds)
            publish(args.out, page(figures, args.rounds, args.requests))
        if args.only in (None, "resnet"):
            resnet_rounds(tmp, figures, args.rounds, args.requests)
            publish(args.out, page(figures, args.rounds, args.requests))


if __name__ == "__main__":
    main()
