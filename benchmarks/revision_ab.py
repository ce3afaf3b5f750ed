"""The server's own overhead against an earlier revision: the no-op handler's requests/s,
this working tree against one or more ``--base`` revisions, in rotating rounds.

    python benchmarks/revision_ab.py --base b05bbcd [--base HEAD ...]

Each base revision is checked out into a temporary git worktree and served from it
(``PYTHONPATH``; workers inherit it), the working tree from here; all with their default
settings, one worker, the same no-op archive, the same load generator (this tree's
``ferry bench load`` machinery), closed loop. Each round measures every server, each
going first in turn; a warm-up precedes every measurement. Writes the medians and this
tree's ratio to each base to ``benchmarks/results/revision_ab.md``.

With ``--tracing grpc`` (or ``http/protobuf``), every server traces every request and
exports over OTLP to one collector stand-in (``benchmarks/otlp_sink.py``, as
``tracing_overhead.py`` runs it): what a change to tracing costs or saves.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.common import ROOT, machine_description, noop_archive, publish
from benchmarks.tracing_overhead import SINK_NICENESS, collector
from ferry_bench.load import LoadSpec, run_load

RESULTS = ROOT / "benchmarks" / "results"


@contextlib.contextmanager
def worktree(revision: str, folder: Path) -> Iterator[Path]:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), revision],
        check=True,
        capture_output=True,
    )
    try:
        yield folder
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False
        )


@contextlib.contextmanager
def served(
    source: Path, store: Path, work: Path, extra_env: dict[str, str] | None = None
) -> Iterator[str]:
    """``ferry serve`` from ``source`` on free ports; the no-op model's URL."""
    ready = work / f"ready-{time.monotonic_ns()}.json"
    loopback = "http://127.0.0.1:0"
    argv = [
        *(sys.executable, "-m", "ferry", "serve", "--model-store", str(store)),
        *("--models", "noop=noop.mar", "--ready-file", str(ready)),
        *("--inference-address", loopback, "--management-address", loopback),
        *("--metrics-address", loopback),
    ]
    # gRPC ports by environment: a revision without gRPC ignores them (with a warning).
    env = {**os.environ, "PYTHONPATH": str(source), **(extra_env or {})}
    env |= {"FERRY_GRPC_INFERENCE_PORT": "0", "FERRY_GRPC_MANAGEMENT_PORT": "0"}
    with open(ready.with_suffix(".log"), "wb") as log:
        process = subprocess.Popen(argv, cwd=work, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server from {source} did not start; see {log.name}")
            time.sleep(0.1)  # polling the ready file a starting server writes
        yield json.loads(ready.read_text())["inference"] + "/predictions/noop"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def throughput(url: str, concurrency: int, seconds: float) -> float:
    warm = LoadSpec(url, [b"x"], concurrency=concurrency, requests=2000)
    asyncio.run(run_load(warm))
    result = asyncio.run(run_load(LoadSpec(url, [b"x"], concurrency=concurrency, duration=seconds)))
    if result.failed:
        raise RuntimeError(f"{result.failed} requests to {url} failed")
    return result.throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base",
        action="append",
        help="a git revision to compare with (repeat for several; default b05bbcd)",
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--tracing",
        choices=("grpc", "http/protobuf"),
        help="trace every request, exported over OTLP with this protocol",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "revision_ab.md")
    args = parser.parse_args()
    bases: list[str] = list(dict.fromkeys(args.base or ["b05bbcd"]))
    figures = measure(bases, args.rounds, args.seconds, args.concurrency, args.tracing)
    command = " ".join(f"--base {base}" for base in bases)
    if args.tracing:
        command += f" --tracing {args.tracing}"
    publish(
        args.out,
        [
            "# The server's own overhead against an earlier revision",
            "",
            f"Machine: {machine_description()}; servers and load generator share its cores.",
            f"Command: `python benchmarks/revision_ab.py {command} --rounds "
            f"{args.rounds} --seconds {args.seconds:g} --concurrency {args.concurrency}`: "
            "the no-op handler, closed loop, each server fresh with its defaults, the order "
            "rotating between rounds, a warm-up of 2000 requests before each measurement"
            + (
                f"; every request traced, exported over OTLP/{args.tracing} to "
                f"`benchmarks/otlp_sink.py` (at niceness {SINK_NICENESS})."
                if args.tracing
                else "."
            ),
            "",
            "| server | req/s per round | median |",
            "|---|---|---|",
            *(
                f"| {name} | {_rounds(rates)} | {statistics.median(rates):.0f} |"
                for name, rates in figures.items()
            ),
            "",
            *(_against(figures[THIS_TREE], base, figures[base]) for base in bases),
        ],
    )


THIS_TREE = "this tree"


def measure(
    bases: list[str], rounds: int, seconds: float, concurrency: int, tracing: str | None = None
) -> dict[str, list[float]]:
    """Requests/s per round of each base revision and of this tree (last), in that order."""
    figures: dict[str, list[float]] = {name: [] for name in [*bases, THIS_TREE]}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as checkouts:
        work = Path(tmp)
        store = work / "store"
        noop_archive(store, 8)
        traced: dict[str, str] = {}
        if tracing:
            sink = checkouts.enter_context(collector(work, tracing))
            traced = {
                "FERRY_ENABLE_TRACING": "true",
                "OTEL_EXPORTER_OTLP_PROTOCOL": tracing,
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
            }
        sources = {
            base: checkouts.enter_context(worktree(base, work / f"base-{index}"))
            for index, base in enumerate(bases)
        }
        sources[THIS_TREE] = ROOT
        names = list(sources)
        for round_index in range(rounds):
            shift = round_index % len(names)  # each server goes first in turn
            for name in names[shift:] + names[:shift]:
                with served(sources[name], store, work, traced) as url:
                    rate = throughput(url, concurrency, seconds)
                figures[name].append(rate)
                print(f"round {round_index + 1} {name}: {rate:.0f} req/s", flush=True)
    return figures


def _against(tree: list[float], base: str, rates: list[float]) -> str:
    ratio = statistics.median(tree) / statistics.median(rates)
    wins = sum(ours > theirs for ours, theirs in zip(tree, rates, strict=True))
    return (
        f"This tree against {base}: **{ratio:.2f}** (medians); ahead in {wins} of "
        f"{len(rates)} rounds.  "
    )


def _rounds(rates: list[float]) -> str:
    return ", ".join(f"{rate:.0f}" for rate in rates)


if __name__ == "__main__":
    main()
