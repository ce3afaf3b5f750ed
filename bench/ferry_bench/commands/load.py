"""``ferry bench load``: load-test a server over HTTP or gRPC (``ferry_bench.load``), with
the server's own figures from its metrics when it is Ferry."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ferry_bench.commands.arguments import floats

if TYPE_CHECKING:
    from ferry_bench.load import LoadSpec

HELP: str = "load-test a server over HTTP (any REST API) or gRPC"
DESCRIPTION: str | None = (
    "Closed loop at a fixed concurrency, or open loop at a fixed Poisson rate. "
    "URL: http(s)://HOST:PORT/PATH (a POST of each input), "
    "grpc://HOST:PORT/predictions/MODEL[/VERSION] (TorchServe's Predictions) or "
    "grpc://HOST:PORT/v2/models/MODEL[/versions/V]/infer (Open Inference ModelInfer). "
    "Exits 1 when more than --max-error-rate of the requests fail."
)
NEEDS: tuple[str, ...] = ("aiohttp",)
"""The bench extra's modules this command imports (checked before it starts)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="e.g. http://127.0.0.1:8080/predictions/resnet18")
    parser.add_argument("--input", required=True, help="comma-separated files sent in turn")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--concurrency", type=int, help="closed loop: clients")
    mode.add_argument(
        "--rate",
        help="open loop: Poisson arrivals per second; several (e.g. 50,100,200) sweep the "
        "rates in turn, each for --requests or --duration, and plot latency against load",
    )
    mode.add_argument("--steps", help="open loop in steps of RATE:SECONDS, e.g. 50:10,200:10,50:10")
    parser.add_argument(
        "--bursts", help="with --rate: ON,OFF seconds of traffic and silence, e.g. 1,2"
    )
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--requests", type=int)
    stop.add_argument("--duration", type=float, help="seconds")
    parser.add_argument("--content-type", default="application/octet-stream")
    parser.add_argument("--token", help="inference key, sent as 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--max-error-rate",
        type=float,
        default=0.0,
        help="share of failed requests (0..1) above which the command exits 1 (default 0)",
    )
    parser.add_argument(
        "--metrics-url",
        help="Ferry metrics endpoint (default: port 8082 when the target is on 8080 or 7070)",
    )
    parser.add_argument("--out", type=Path, help="folder for load.json")
    parser.add_argument("--seed", type=int, default=0, help="open-loop arrival seed")


DEFAULT_METRICS_PORTS = {8080: 8082, 7070: 8082}
"""Ferry's (and TorchServe's) default ports: inference REST or gRPC -> metrics."""


def _default_metrics_url(url: str) -> str | None:
    parts = urlsplit(url)
    metrics_port = DEFAULT_METRICS_PORTS.get(parts.port or 0)
    if metrics_port is None or parts.hostname is None:
        return None
    scheme = "https" if parts.scheme == "https" else "http"
    return urlunsplit((scheme, f"{parts.hostname}:{metrics_port}", "/metrics", "", ""))


def _model_name(url: str) -> str | None:
    """The model a TorchServe or Open Inference URL names (REST or gRPC)."""
    segments = urlsplit(url).path.strip("/").split("/")
    if len(segments) >= 2 and segments[0] == "predictions":
        return segments[1]
    if len(segments) >= 3 and segments[:2] == ["v2", "models"]:
        return segments[2]
    return None


async def _measure(spec: LoadSpec, metrics_url: str | None) -> dict[str, Any]:
    from ferry_bench.load import run_load
    from ferry_bench.load_report import load_summary
    from ferry_bench.server_stats import scrape, server_figures
    from ferry_bench.targets import check_reachable

    await check_reachable(spec.url)
    model = _model_name(spec.url)
    before = await scrape(metrics_url) if metrics_url and model else None
    result = await run_load(spec)
    summary = load_summary(spec, result)
    if metrics_url is None:
        summary["server"] = "not measured: give --metrics-url for a Ferry server's figures"
    elif model is None:
        summary["server"] = "not measured: the URL names no model"
    elif before is None:
        summary["server"] = f"not measured: no Ferry metrics at {metrics_url}"
    else:
        after = await scrape(metrics_url)
        if after is None:
            summary["server"] = f"not measured: {metrics_url} stopped answering"
        else:
            summary["server"] = server_figures(before, after, model, summary["max_ms"])
    return summary


def load_specs(args: argparse.Namespace, payloads: list[bytes]) -> list[LoadSpec]:
    """One spec per offered rate (one for a closed loop or steps); ``ValueError`` says
    what is wrong with the arguments."""
    from ferry_bench.load import LoadSpec

    for name in ("concurrency", "requests", "duration"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name} must be positive")
    if args.steps is None and args.requests is None and args.duration is None:
        raise ValueError("give --requests or --duration (--steps set their own duration)")
    if not 0 <= args.max_error_rate <= 1:
        raise ValueError("--max-error-rate must be between 0 and 1")
    if args.bursts is not None and args.rate is None:
        raise ValueError("--bursts shape --rate traffic: give --rate too")
    steps = None
    if args.steps is not None:
        try:
            pairs = [part.split(":") for part in args.steps.split(",") if part.strip()]
            steps = tuple((float(rate), float(seconds)) for rate, seconds in pairs)
        except ValueError:
            raise ValueError(f"--steps must be RATE:SECONDS,..., got {args.steps!r}") from None
        if not steps or min(min(step) for step in steps) <= 0:
            raise ValueError("--steps need positive rates and durations")
    bursts = None
    if args.bursts is not None:
        on_off = floats(args.bursts, "--bursts")
        if len(on_off) != 2:
            raise ValueError("--bursts takes ON,OFF seconds")
        bursts = (on_off[0], on_off[1])
    rates: list[float | None] = list(floats(args.rate, "--rate")) if args.rate else [None]
    return [
        LoadSpec(
            args.url,
            payloads,
            concurrency=args.concurrency,
            rate=rate,
            requests=args.requests,
            duration=args.duration,
            content_type=args.content_type,
            seed=args.seed,
            progress=True,
            token=args.token,
            bursts=bursts,
            steps=steps,
        )
        for rate in rates
    ]


def _plot_rates(summaries: list[dict[str, Any]], path: Path, url: str, seed: int) -> None:
    """p50/p99 of successful answers per offered rate, the share shed or failed beneath,
    and the sweep's warnings on the picture."""
    from ferry_bench.latency_plot import plot_latency_against_load
    from ferry_bench.load_report import failure_shares, rate_warnings
    from ferry_bench.sweep_report import conditions

    plot_latency_against_load(
        {"measured": [(s["rate"], s["p50_ms"], s["p99_ms"]) for s in summaries]},
        path,
        f"ferry bench load: {url}",
        f"{summaries[0]['traffic'].split(' ')[0]} arrivals, seed {seed}; " + conditions(),
        failures=failure_shares(summaries),
        warnings=rate_warnings(summaries),
    )


def run(args: argparse.Namespace) -> int:
    from ferry_bench.load_report import format_summary, rate_table
    from ferry_bench.target_types import Unreachable, UnsupportedTarget

    try:
        payloads = [Path(p).read_bytes() for p in args.input.split(",") if p]
    except OSError as exc:
        print(f"ferry bench load: --input: {exc}", file=sys.stderr)
        return 2
    try:
        specs = load_specs(args, payloads)
    except ValueError as exc:
        print(f"ferry bench load: {exc}", file=sys.stderr)
        return 2
    metrics_url = args.metrics_url or _default_metrics_url(args.url)
    summaries = []
    for spec in specs:
        try:
            summary = asyncio.run(_measure(spec, metrics_url))
        except (UnsupportedTarget, Unreachable) as exc:
            print(f"ferry bench load: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, UnsupportedTarget) else 1
        if len(specs) > 1:
            print(f"\n## offered {spec.rate:g} requests/s")
        print(format_summary(summary))
        summaries.append(summary)
    if len(specs) > 1:
        print("\n" + rate_table(summaries))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        document: Any = summaries[0] if len(summaries) == 1 else {"rates": summaries}
        (args.out / "load.json").write_text(json.dumps(document, indent=2))
        if len(specs) > 1:
            _plot_rates(summaries, args.out / "load.png", args.url, args.seed)
            print(f"wrote {args.out / 'load.png'}")
    worst = max(s["error_rate"] for s in summaries)
    if worst > args.max_error_rate:
        print(
            f"ferry bench load: {worst:.2%} of requests failed, more than "
            f"--max-error-rate {args.max_error_rate:.2%}",
            file=sys.stderr,
        )
        return 1
    return 0
