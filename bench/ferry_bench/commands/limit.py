"""``ferry bench limit``: how far a server is from the model's limit (``ferry_bench.limit_run``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ferry.batching.registry import BATCH_POLICIES
from ferry_bench.commands.arguments import duration_ms, floats

HELP: str = "how far a server is from the model's limit: bounds, and an ideal dispatcher"
DESCRIPTION: str | None = (
    "Profiles the model's batch costs, measures the round trip on a no-op "
    "model, then loads a server (Ferry, started here, or --url) at fractions of the "
    "throughput ceiling and compares its p50/p99 with an ideal dispatcher fed the same "
    "arrivals. Writes limit.md, limit.json and limit.png."
)
NEEDS: tuple[str, ...] = ("aiohttp", "httpx", "matplotlib")
"""The bench extra's modules this command imports (checked before it starts)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="a .mar, .tar.gz or model folder")
    parser.add_argument("--input", required=True, help="comma-separated request bodies")
    parser.add_argument("--slo-p99", required=True, help="e.g. 100ms or 0.1s")
    parser.add_argument("--content-type", default="application/octet-stream")
    parser.add_argument("--batch-size", type=int, help="default: the archive's batchSize")
    parser.add_argument("--max-batch-delay", type=int, help="ms; default: the archive's")
    parser.add_argument("--workers", type=int, help="default: the archive's minWorkers")
    parser.add_argument(
        "--fractions",
        default="0.1,0.3,0.5,0.7,0.8,0.9,0.95",
        help="offered loads, as fractions of the ceiling X*",
    )
    parser.add_argument(
        "--rates", help="offered loads in requests/s instead of --fractions (e.g. 5,10,20)"
    )
    parser.add_argument(
        "--batch-policy",
        choices=BATCH_POLICIES.names(),
        help="the started Ferry server's batch policy (default: the archive's)",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    parser.add_argument("--profile-seconds", type=float, default=2.0, help="timing per batch size")
    parser.add_argument("--seed", type=int, default=0, help="arrival seed")
    parser.add_argument(
        "--url", help="a running server's prediction URL (any TorchServe-API server)"
    )
    parser.add_argument("--noop-url", help="with --url: a no-op model's URL for the round trip")
    parser.add_argument("--out", type=Path, default=Path("limit-results"))


def run(args: argparse.Namespace) -> int:
    from ferry_bench.limit_report import write_limit_report
    from ferry_bench.limit_run import LimitSpec, default_settings, echo, measure_limit
    from ferry_bench.servers import ServerFailed

    try:
        slo_ms = duration_ms(args.slo_p99)
        inputs = [Path(p).resolve() for p in args.input.split(",") if p]
        if slo_ms <= 0 or not inputs or not all(p.is_file() for p in inputs):
            raise ValueError("the SLO must be positive and every input a file")
        fractions = floats(args.fractions, "--fractions")
        rates = sorted(floats(args.rates, "--rates")) if args.rates else None
        if args.batch_policy and args.url:
            raise ValueError("--batch-policy sets the server started here; not with --url")
        if max(fractions) >= 1.5:
            raise ValueError("--fractions are shares of the ceiling, e.g. 0.1,0.5,0.9")
        model = args.model.resolve()
        batch, delay, workers = default_settings(model)
        for name, value in (
            ("batch-size", args.batch_size),
            ("workers", args.workers),
            ("duration", args.duration),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"--{name} must be positive")
    except (ValueError, OSError) as exc:
        print(f"ferry bench limit: {exc}", file=sys.stderr)
        return 2
    spec = LimitSpec(
        model=model,
        inputs=inputs,
        slo_ms=slo_ms,
        batch_size=args.batch_size or batch,
        max_batch_delay=args.max_batch_delay if args.max_batch_delay is not None else delay,
        workers=args.workers or workers,
        fractions=sorted(fractions),
        seconds=args.duration,
        profile_seconds=args.profile_seconds,
        seed=args.seed,
        content_type=args.content_type,
        url=args.url,
        noop_url=args.noop_url,
        batch_policy=args.batch_policy,
        rates=rates,
    )
    out = args.out.resolve()
    try:
        report = measure_limit(spec, out / "servers", echo)
    except (ServerFailed, RuntimeError) as exc:
        print(f"ferry bench limit: {exc}", file=sys.stderr)
        return 1
    for path in write_limit_report(report, out, model.name):
        print(path)
    print((out / "limit.md").read_text().split("## Per offered load")[0].split("## Ratios")[1])
    return 0
