"""The server's own overhead against an earlier revision: the no-op handler's requests/s,
this working tree against ``--base``, in alternating rounds.

    python benchmarks/revision_ab.py --base b05bbcd

The base revision is checked out into a temporary git worktree and served from it
(``PYTHONPATH``; workers inherit it), the working tree from here; both with their default
settings, one worker, the same no-op archive, the same load generator (this tree's
``ferry bench load`` machinery), closed loop. Each round measures both, the order
alternating; a warm-up precedes every measurement. Writes the medians and their ratio to
``benchmarks/results/revision_ab.md``.
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
from ferry.bench.load import LoadSpec, run_load

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
def served(source: Path, store: Path, work: Path) -> Iterator[str]:
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
    env = {**os.environ, "PYTHONPATH": str(source)}
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
    parser.add_argument("--base", default="b05bbcd", help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS / "revision_ab.md")
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"base": [], "this tree": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = work / "store"
        noop_archive(store, 8)
        with worktree(args.base, work / "base") as checkout:
            sources = {"base": checkout, "this tree": ROOT}
            for round_index in range(args.rounds):
                order = list(sources) if round_index % 2 == 0 else list(sources)[::-1]
                for name in order:
                    with served(sources[name], store, work) as url:
                        rate = throughput(url, args.concurrency, args.seconds)
                    figures[name].append(rate)
                    print(f"round {round_index + 1} {name}: {rate:.0f} req/s", flush=True)
    base_rate, head_rate = (statistics.median(figures[n]) for n in ("base", "this tree"))
    wins = sum(h > b for b, h in zip(figures["base"], figures["this tree"], strict=True))
    publish(
        args.out,
        [
            "# The server's own overhead against an earlier revision",
            "",
            f"Machine: {machine_description()}; servers and load generator share its cores.",
            f"Command: `python benchmarks/revision_ab.py --base {args.base} --rounds "
            f"{args.rounds} --seconds {args.seconds:g} --concurrency {args.concurrency}`: "
            "the no-op handler, closed loop, each server fresh with its defaults, the order "
            "alternating between rounds, a warm-up of 2000 requests before each measurement.",
            "",
            "| server | req/s per round | median |",
            "|---|---|---|",
            f"| {args.base} | {_rounds(figures['base'])} | {base_rate:.0f} |",
            f"| this tree | {_rounds(figures['this tree'])} | {head_rate:.0f} |",
            "",
            f"This tree against {args.base}: **{head_rate / base_rate:.2f}** (medians); ahead in "
            f"{wins} of {args.rounds} rounds.",
        ],
    )


def _rounds(rates: list[float]) -> str:
    return ", ".join(f"{rate:.0f}" for rate in rates)


if __name__ == "__main__":
    main()
