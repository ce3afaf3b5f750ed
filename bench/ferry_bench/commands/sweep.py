"""``ferry bench sweep``: a grid of server configurations, a fresh server each
(``ferry_bench.sweep``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ferry_bench.commands.progress import Eta, row_line

HELP: str = "batch size x delay x workers x concurrency, a fresh server each"
DESCRIPTION: str | None = (
    "SPEC.yaml keys: model, input, content_type, batch_size, max_batch_delay, "
    "workers, concurrency (lists), requests or duration, server (ferry or torchserve)."
)
NEEDS: tuple[str, ...] = ("aiohttp", "httpx", "matplotlib")
"""The bench extra's modules this command imports (checked before it starts)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path)
    parser.add_argument("--out", type=Path, default=Path("sweep-results"))


def run(args: argparse.Namespace) -> int:
    from ferry.errors import ConfigError
    from ferry_bench.sweep import SweepSpec, run_sweep
    from ferry_bench.sweep_report import write_sweep_reports

    try:
        spec = SweepSpec.read(args.spec)
    except ConfigError as error:
        print(f"ferry bench sweep: {error.message}", file=sys.stderr)
        return 2
    total = len(spec.configurations()) * len(spec.concurrency)
    eta = Eta(total)

    def report(row: dict[str, Any]) -> None:
        print(f"[{eta.done + 1}/{total}] {row_line(row)} ({eta.step()})", file=sys.stderr)

    rows = run_sweep(spec, args.out.resolve(), report)
    for path in write_sweep_reports(rows, args.out, spec.model.name):
        print(path)
    failed = sum(1 for row in rows if row.get("Error"))
    if failed:
        print(f"ferry bench sweep: {failed} of {len(rows)} points failed", file=sys.stderr)
    return 1 if failed == len(rows) else 0
