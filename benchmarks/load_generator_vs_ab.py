"""Is ``ferry bench load`` fast enough not to be the bottleneck? Against the same no-op
server, at the same concurrency, compare it with Apache Bench (``ab``, from Debian's
apache2-utils), alternating rounds.

    python benchmarks/load_generator_vs_ab.py --out benchmarks/results/load_generator_vs_ab.md
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_description, noop_archive, publish
from benchmarks.server import ferry_server

FERRY = str(Path(sys.executable).parent / "ferry")


def ab_rps(url: str, payload: Path, concurrency: int, requests: int) -> float:
    run = subprocess.run(
        [
            "ab",
            "-q",
            "-k",
            "-n",
            str(requests),
            "-c",
            str(concurrency),
            "-p",
            str(payload),
            "-T",
            "application/octet-stream",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(r"Requests per second:\s+([\d.]+)", run.stdout)
    failed = re.search(r"Failed requests:\s+(\d+)", run.stdout)
    if match is None or failed is None or int(failed.group(1)):
        raise RuntimeError(f"ab failed:\n{run.stdout}\n{run.stderr}")
    return float(match.group(1))


def ferry_rps(url: str, payload: Path, concurrency: int, requests: int, out: Path) -> float:
    subprocess.run(
        [
            FERRY,
            "bench",
            "load",
            url,
            "--input",
            str(payload),
            "--concurrency",
            str(concurrency),
            "--requests",
            str(requests),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    figures = json.loads((out / "load.json").read_text())
    if figures["errors"]:
        raise RuntimeError(f"errors: {figures['errors']}")
    return float(figures["throughput"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/load_generator_vs_ab.md")
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if shutil.which("ab") is None:
        sys.exit("ab not found: apt-get install apache2-utils")
    tmp = Path(tempfile.mkdtemp(prefix="ferry-ab-"))
    store = tmp / "store"
    archive = noop_archive(store, batch_size=8)
    payload = tmp / "payload.bin"
    payload.write_bytes(b"x" * 100)
    ferry_figures, ab_figures = [], []
    flags = ["--access-log", "false"]  # the server's logging is not what is compared here
    with ferry_server(store, [f"noop={archive}"], tmp, *flags) as server:
        url = f"{server.url}/predictions/noop"
        ab_rps(url, payload, args.concurrency, 2000)  # warm-up
        for index in range(args.rounds):
            measure: list[Callable[[], None]] = [
                lambda: ferry_figures.append(
                    ferry_rps(url, payload, args.concurrency, args.requests, tmp / "out")
                ),
                lambda: ab_figures.append(ab_rps(url, payload, args.concurrency, args.requests)),
            ]
            for step in measure if index % 2 == 0 else reversed(measure):
                step()
            print(
                f"round {index + 1}: ferry {ferry_figures[-1]:.0f}, ab {ab_figures[-1]:.0f}",
                flush=True,
            )
    med = statistics.median
    ratios = [f / a for f, a in zip(ferry_figures, ab_figures, strict=True)]
    lines = [
        "# `ferry bench load` against Apache Bench, same no-op server",
        "",
        f"Machine: {machine_description()}.",
        f"No-op handler, batch size 8, access log off; concurrency {args.concurrency}, "
        f"{args.requests} requests per run, {args.rounds} rounds alternating the two clients "
        "(`ab -k`, keep-alive like ours). Both clients run on the same 2 cores as the server. "
        "Produced by `benchmarks/load_generator_vs_ab.py` in one run.",
        "",
        "| client | median req/s |",
        "|---|---|",
        f"| `ferry bench load` | {med(ferry_figures):.0f} |",
        f"| `ab` | {med(ab_figures):.0f} |",
        "",
        f"Median per-round ratio ferry / ab: **{med(ratios):.3f}**. Per round: "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + ".",
        "",
    ]
    publish(args.out, lines)


if __name__ == "__main__":
    main()
