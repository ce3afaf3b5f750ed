"""``ferry bench``: measure models and servers."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ferry.bench.load import LoadSpec, run_load
from ferry.bench.load_report import format_summary, load_summary
from ferry.bench.server_stats import scrape, server_figures


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("bench", help="measure models and servers")
    tools = parser.add_subparsers(dest="tool", required=True)
    load = tools.add_parser(
        "load",
        help="load-test any server with TorchServe's inference API",
        description="Closed loop at a fixed concurrency, or open loop at a fixed Poisson rate.",
    )
    load.add_argument("url", help="e.g. http://127.0.0.1:8080/predictions/resnet18")
    load.add_argument("--input", required=True, help="comma-separated files sent in turn")
    mode = load.add_mutually_exclusive_group(required=True)
    mode.add_argument("--concurrency", type=int)
    mode.add_argument("--rate", type=float, help="requests per second (open loop)")
    stop = load.add_mutually_exclusive_group(required=True)
    stop.add_argument("--requests", type=int)
    stop.add_argument("--duration", type=float, help="seconds")
    load.add_argument("--content-type", default="application/octet-stream")
    load.add_argument(
        "--metrics-url",
        help="Ferry metrics endpoint (default: port 8082 when the target is on 8080)",
    )
    load.add_argument("--out", type=Path, help="folder for load.json")
    load.add_argument("--seed", type=int, default=0, help="open-loop arrival seed")
    load.set_defaults(run=run_load_command)


def _default_metrics_url(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.port != 8080 or parts.hostname is None:
        return None
    return urlunsplit((parts.scheme, f"{parts.hostname}:8082", "/metrics", "", ""))


def _model_name(url: str) -> str | None:
    segments = urlsplit(url).path.strip("/").split("/")
    return segments[1] if len(segments) >= 2 and segments[0] == "predictions" else None


async def _measure(spec: LoadSpec, metrics_url: str | None) -> dict[str, Any]:
    before = await scrape(metrics_url) if metrics_url else None
    result = await run_load(spec)
    summary = load_summary(spec, result)
    model = _model_name(spec.url)
    if before is not None and metrics_url and model:
        after = await scrape(metrics_url)
        if after is not None:
            summary["server"] = server_figures(before, after, model)
    return summary


def run_load_command(args: argparse.Namespace) -> int:
    for name, value in (
        ("concurrency", args.concurrency),
        ("rate", args.rate),
        ("requests", args.requests),
        ("duration", args.duration),
    ):
        if value is not None and value <= 0:
            print(f"ferry bench load: --{name} must be positive", file=sys.stderr)
            return 2
    try:
        payloads = [Path(p).read_bytes() for p in args.input.split(",") if p]
    except OSError as exc:
        print(f"ferry bench load: {exc}", file=sys.stderr)
        return 2
    spec = LoadSpec(
        args.url,
        payloads,
        concurrency=args.concurrency,
        rate=args.rate,
        requests=args.requests,
        duration=args.duration,
        content_type=args.content_type,
        seed=args.seed,
        progress=True,
    )
    summary = asyncio.run(_measure(spec, args.metrics_url or _default_metrics_url(args.url)))
    print(format_summary(summary))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "load.json").write_text(json.dumps(summary, indent=2))
    return 0
