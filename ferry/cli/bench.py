"""``ferry bench``: measure models and servers.

The bench tools need the ``bench`` extra (aiohttp, httpx, matplotlib), which the server does
not: ``ferry.bench`` is imported only once a bench command runs, and a missing extra is
reported in one line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from ferry.bench.load import LoadSpec

Command = Callable[[argparse.Namespace], int]

BENCH_EXTRA_MODULES = ("aiohttp", "httpx", "matplotlib")
"""The modules ``pip install 'ferry-serve[bench]'`` brings."""


def needing_bench_extra(command: Command, *modules: str) -> Command:
    """``command``, run only once ``modules`` (from the bench extra) import.

    They are imported before the command starts, so a sweep does not run for an hour and
    then fail to plot; a bench module importing one of them later is caught the same way.
    """

    def run(args: argparse.Namespace) -> int:
        try:
            for name in modules:
                importlib.import_module(name)
            return command(args)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").partition(".")[0]
            if missing not in BENCH_EXTRA_MODULES:
                raise
            print(
                f"ferry bench {args.tool}: needs the 'bench' extra: "
                f"pip install 'ferry-serve[bench]' (missing module {missing})",
                file=sys.stderr,
            )
            return 2

    return run


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help="measure models and servers",
        description="Measure models and servers. Needs the 'bench' extra: "
        "pip install 'ferry-serve[bench]'",
    )
    tools = parser.add_subparsers(dest="tool", required=True)
    load = tools.add_parser(
        "load",
        help="load-test a server over HTTP (any REST API) or gRPC",
        description="Closed loop at a fixed concurrency, or open loop at a fixed Poisson rate. "
        "URL: http(s)://HOST:PORT/PATH (a POST of each input), "
        "grpc://HOST:PORT/predictions/MODEL[/VERSION] (TorchServe's Predictions) or "
        "grpc://HOST:PORT/v2/models/MODEL[/versions/V]/infer (Open Inference ModelInfer). "
        "Exits 1 when more than --max-error-rate of the requests fail.",
    )
    load.add_argument("url", help="e.g. http://127.0.0.1:8080/predictions/resnet18")
    load.add_argument("--input", required=True, help="comma-separated files sent in turn")
    mode = load.add_mutually_exclusive_group(required=True)
    mode.add_argument("--concurrency", type=int, help="closed loop: clients")
    mode.add_argument(
        "--rate",
        help="open loop: Poisson arrivals per second; several (e.g. 50,100,200) sweep the "
        "rates in turn, each for --requests or --duration, and plot latency against load",
    )
    mode.add_argument("--steps", help="open loop in steps of RATE:SECONDS, e.g. 50:10,200:10,50:10")
    load.add_argument(
        "--bursts", help="with --rate: ON,OFF seconds of traffic and silence, e.g. 1,2"
    )
    stop = load.add_mutually_exclusive_group()
    stop.add_argument("--requests", type=int)
    stop.add_argument("--duration", type=float, help="seconds")
    load.add_argument("--content-type", default="application/octet-stream")
    load.add_argument("--token", help="inference key, sent as 'Authorization: Bearer KEY'")
    load.add_argument(
        "--max-error-rate",
        type=float,
        default=0.0,
        help="share of failed requests (0..1) above which the command exits 1 (default 0)",
    )
    load.add_argument(
        "--metrics-url",
        help="Ferry metrics endpoint (default: port 8082 when the target is on 8080 or 7070)",
    )
    load.add_argument("--out", type=Path, help="folder for load.json")
    load.add_argument("--seed", type=int, default=0, help="open-loop arrival seed")
    load.set_defaults(run=needing_bench_extra(run_load_command, "aiohttp"))

    profile = tools.add_parser(
        "profile",
        help="time a model's handler offline at each batch size (no server)",
        description="Without --batch-sizes, doubles from 1 until memory runs out or time per "
        "item stops improving.",
    )
    profile.add_argument("model", type=Path, help="a .mar, .tar.gz or model folder")
    profile.add_argument("--input", required=True, help="comma-separated request bodies")
    profile.add_argument("--batch-sizes", help="e.g. 1,2,4,8")
    profile.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    profile.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16,bf16")
    profile.add_argument("--seconds", type=float, default=2.0, help="timing per point")
    profile.add_argument(
        "--threads",
        type=int,
        help="torch threads (default: what one worker gets on this machine; set what your "
        "workers get: cores / workers)",
    )
    profile.add_argument("--out", type=Path, help="folder for profile.csv/.json/.png")
    profile.set_defaults(run=needing_bench_extra(run_profile_command, "matplotlib"))

    sweep = tools.add_parser(
        "sweep",
        help="batch size x delay x workers x concurrency, a fresh server each",
        description="SPEC.yaml keys: model, input, content_type, batch_size, max_batch_delay, "
        "workers, concurrency (lists), requests or duration, server (ferry or torchserve).",
    )
    sweep.add_argument("spec", type=Path)
    sweep.add_argument("--out", type=Path, default=Path("sweep-results"))
    sweep.set_defaults(run=needing_bench_extra(run_sweep_command, *BENCH_EXTRA_MODULES))

    limit = tools.add_parser(
        "limit",
        help="how far a server is from the model's limit: bounds, and an ideal dispatcher",
        description="Profiles the model's batch costs, measures the round trip on a no-op "
        "model, then loads a server (Ferry, started here, or --url) at fractions of the "
        "throughput ceiling and compares its p50/p99 with an ideal dispatcher fed the same "
        "arrivals. Writes limit.md, limit.json and limit.png.",
    )
    limit.add_argument("model", type=Path, help="a .mar, .tar.gz or model folder")
    limit.add_argument("--input", required=True, help="comma-separated request bodies")
    limit.add_argument("--slo-p99", required=True, help="e.g. 100ms or 0.1s")
    limit.add_argument("--content-type", default="application/octet-stream")
    limit.add_argument("--batch-size", type=int, help="default: the archive's batchSize")
    limit.add_argument("--max-batch-delay", type=int, help="ms; default: the archive's")
    limit.add_argument("--workers", type=int, help="default: the archive's minWorkers")
    limit.add_argument(
        "--fractions",
        default="0.1,0.3,0.5,0.7,0.8,0.9,0.95",
        help="offered loads, as fractions of the ceiling X*",
    )
    limit.add_argument(
        "--rates", help="offered loads in requests/s instead of --fractions (e.g. 5,10,20)"
    )
    limit.add_argument(
        "--batch-policy",
        choices=["adaptive", "immediate", "fixed_window"],
        help="the started Ferry server's batch policy (default: the archive's)",
    )
    limit.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    limit.add_argument("--profile-seconds", type=float, default=2.0, help="timing per batch size")
    limit.add_argument("--seed", type=int, default=0, help="arrival seed")
    limit.add_argument(
        "--url", help="a running server's prediction URL (any TorchServe-API server)"
    )
    limit.add_argument("--noop-url", help="with --url: a no-op model's URL for the round trip")
    limit.add_argument("--out", type=Path, default=Path("limit-results"))
    limit.set_defaults(run=needing_bench_extra(run_limit_command, *BENCH_EXTRA_MODULES))

    tune = tools.add_parser(
        "tune", help="highest throughput whose p99 meets an SLO; writes model-config.yaml"
    )
    tune.add_argument("model", type=Path, help="a .mar, .tar.gz or model folder")
    tune.add_argument("--slo-p99", required=True, help="e.g. 100ms or 0.1s")
    tune.add_argument("--input", required=True, help="comma-separated request bodies")
    tune.add_argument("--content-type", default="application/octet-stream")
    tune.add_argument("--batch-sizes", default="1,2,4,8,16")
    tune.add_argument("--delays", default="5,20", help="max_batch_delay values (ms)")
    tune.add_argument("--workers", default=None, help="default: 1 and the core count")
    tune.add_argument("--concurrency", default="1,2,4,8,16,32")
    tune.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16,bf16")
    tune.add_argument(
        "--requests",
        type=int,
        help="per measurement (default: enough for ten answers beyond p99, and ten per client)",
    )
    tune.add_argument("--out", type=Path, default=Path("tune-results"))
    tune.add_argument(
        "--archive",
        action="store_true",
        help="also write OUT/NAME.mar: the model with the tuned configuration",
    )
    tune.set_defaults(run=needing_bench_extra(run_tune_command, *BENCH_EXTRA_MODULES))


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
    from ferry.bench.load import run_load
    from ferry.bench.load_report import load_summary
    from ferry.bench.server_stats import scrape, server_figures
    from ferry.bench.targets import check_reachable

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


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise ValueError(f"{what} must be positive numbers, got {text!r}")
    return values


def _load_specs(args: argparse.Namespace, payloads: list[bytes]) -> list[LoadSpec]:
    """One spec per offered rate (one for a closed loop or steps); ``ValueError`` says
    what is wrong with the arguments."""
    from ferry.bench.load import LoadSpec

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
        on_off = _floats(args.bursts, "--bursts")
        if len(on_off) != 2:
            raise ValueError("--bursts takes ON,OFF seconds")
        bursts = (on_off[0], on_off[1])
    rates: list[float | None] = list(_floats(args.rate, "--rate")) if args.rate else [None]
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


def run_load_command(args: argparse.Namespace) -> int:
    from ferry.bench.load_report import format_summary, plot_latency_against_load, rate_table
    from ferry.bench.targets import Unreachable, UnsupportedTarget

    try:
        payloads = [Path(p).read_bytes() for p in args.input.split(",") if p]
    except OSError as exc:
        print(f"ferry bench load: --input: {exc}", file=sys.stderr)
        return 2
    try:
        specs = _load_specs(args, payloads)
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
            from ferry.bench.sweep_report import conditions

            points = [(s["rate"], s["p50_ms"], s["p99_ms"]) for s in summaries]
            plot_latency_against_load(
                {"measured": points},
                args.out / "load.png",
                f"ferry bench load: {args.url}",
                f"{summaries[0]['traffic'].split(' ')[0]} arrivals, seed {args.seed}; "
                + conditions(),
            )
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


def _int_list(text: str, minimum: int = 1) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or any(v < minimum for v in values):
        raise ValueError(f"expected comma-separated integers >= {minimum}, got {text!r}")
    return values


def run_profile_command(args: argparse.Namespace) -> int:
    import platform

    import torch

    from ferry.bench.profile import (
        PRECISIONS,
        InputRejected,
        active_optimizations,
        check_inputs,
        load_handler,
        noisy,
        profile,
    )
    from ferry.bench.profile_report import format_optimizations, format_table, write_reports
    from ferry.config.settings import available_cores, threads_per_worker
    from ferry.errors import FerryError
    from ferry.worker.torch_setup import configure_torch

    try:
        batch_sizes = _int_list(args.batch_sizes) if args.batch_sizes else None
        precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
        unknown = [p for p in precisions if p not in PRECISIONS]
        if unknown or not precisions:
            raise ValueError(f"unknown precision {unknown}; use fp32, fp16, bf16")
        names = [p for p in args.input.split(",") if p]
        inputs = [Path(p).read_bytes() for p in names]
        if args.threads is not None and args.threads < 1:
            raise ValueError("--threads must be at least 1")
    except (ValueError, OSError) as exc:
        print(f"ferry bench profile: {exc}", file=sys.stderr)
        return 2
    threads = args.threads or threads_per_worker(available_cores(), 1)
    configure_torch(threads)  # as a worker: its share of the cores
    conditions = (
        f"{platform.machine()}, {available_cores()} cores; {threads} torch threads; "
        f"device {args.device}; torch {torch.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="ferry-profile-") as tmp:
        try:
            loaded = load_handler(args.model.resolve(), Path(tmp), args.device)
            check_inputs(loaded, inputs, names)
        except (FerryError, RuntimeError, InputRejected) as exc:
            print(f"ferry bench profile: {exc}", file=sys.stderr)
            return 2
        optimization = active_optimizations(loaded)
        points = profile(
            loaded,
            inputs,
            batch_sizes,
            precisions,
            args.seconds,
            on_point=lambda p: print(
                f"  batch {p.batch_size} {p.variant} {p.precision}: {p.ms_per_item:.3f} ms/item",
                file=sys.stderr,
            ),
        )
    print(conditions)
    print(format_optimizations(optimization))
    print(format_table(points))
    for warning in noisy(points):
        print(f"ferry bench profile: warning: {warning}", file=sys.stderr)
    if args.out is not None:
        for path in write_reports(points, args.out, args.model.name, optimization, conditions):
            print(path)
    return 0


class _Eta:
    """Elapsed time and the time left, from the measurements done so far."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.start = time.monotonic()
        self.done = 0

    def step(self) -> str:
        self.done += 1
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * max(0, self.total - self.done)
        return f"{_clock(elapsed)} elapsed, at most {_clock(left)} left"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _row_line(row: dict[str, Any]) -> str:
    label = (
        f"batch {row['Batch size']} delay {row['Batch delay']} workers {row['Workers']} "
        f"{row['Precision']} c{row['Concurrency']}"
    )
    if row.get("Error"):
        return f"{label}: failed: {row['Error']}"
    return f"{label}: {row['Throughput']} req/s, p99 {row['Latency P99']} ms"


def run_sweep_command(args: argparse.Namespace) -> int:
    from ferry.bench.sweep import SweepSpec, run_sweep
    from ferry.bench.sweep_report import write_sweep_reports
    from ferry.errors import ConfigError

    try:
        spec = SweepSpec.read(args.spec)
    except ConfigError as error:
        print(f"ferry bench sweep: {error.message}", file=sys.stderr)
        return 2
    total = len(spec.configurations()) * len(spec.concurrency)
    eta = _Eta(total)

    def report(row: dict[str, Any]) -> None:
        print(f"[{eta.done + 1}/{total}] {_row_line(row)} ({eta.step()})", file=sys.stderr)

    rows = run_sweep(spec, args.out.resolve(), report)
    for path in write_sweep_reports(rows, args.out, spec.model.name):
        print(path)
    failed = sum(1 for row in rows if row.get("Error"))
    if failed:
        print(f"ferry bench sweep: {failed} of {len(rows)} points failed", file=sys.stderr)
    return 1 if failed == len(rows) else 0


def _duration_ms(text: str) -> float:
    value = text.strip().lower()
    for suffix, scale in (("ms", 1.0), ("s", 1000.0)):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * scale
    return float(value)


def run_tune_command(args: argparse.Namespace) -> int:
    from ferry.bench.servers import (
        ServerConfig,
        ServerFailed,
        copy_with_config,
        model_config_document,
        model_identity,
        start_server,
        zip_folder,
    )
    from ferry.bench.sweep import SweepSpec, config_label, failed_row, measure, warm_up
    from ferry.bench.sweep_report import markdown_table, plot_throughput_against_p99, write_csv
    from ferry.bench.tune import (
        Trial,
        config_changes,
        configurations,
        model_config_yaml,
        requests_for_percentile,
        search,
        tuned_config,
    )
    from ferry.config.settings import available_cores

    try:
        slo_ms = _duration_ms(args.slo_p99)
        batch_sizes, delays = _int_list(args.batch_sizes), _int_list(args.delays, minimum=0)
        workers = _int_list(args.workers) if args.workers else sorted({1, available_cores()})
        concurrencies = _int_list(args.concurrency)
        precisions = [p.strip().lower() for p in args.precision.split(",") if p.strip()]
        if not precisions or any(p not in ("fp32", "fp16", "bf16") for p in precisions):
            raise ValueError(f"precision must be fp32, fp16 or bf16, got {args.precision!r}")
        inputs = [Path(p).resolve() for p in args.input.split(",") if p]
        if slo_ms <= 0 or not all(p.is_file() for p in inputs):
            raise ValueError("the SLO must be positive and every input a file")
        if args.requests is not None and args.requests < max(concurrencies):
            raise ValueError(
                f"--requests {args.requests} is fewer than the highest concurrency "
                f"{max(concurrencies)}: some clients would send nothing"
            )
    except ValueError as exc:
        print(f"ferry bench tune: {exc}", file=sys.stderr)
        return 2
    if args.requests is not None and args.requests < requests_for_percentile(99, 1):
        print(
            f"ferry bench tune: warning: with {args.requests} requests per point, p99 rests "
            f"on the slowest {max(1, args.requests // 100)} answers; leave --requests out to "
            "measure enough for p99",
            file=sys.stderr,
        )
    model = args.model.resolve()
    out = args.out.resolve()
    name, _ = model_identity(model)
    base_config = model_config_document(model)
    configs = configurations(batch_sizes, delays, workers, precisions)
    spec = SweepSpec(
        model,
        inputs,
        args.content_type,
        batch_sizes,
        delays,
        workers,
        concurrencies,
        precisions,
        args.requests,
        None,
        "ferry",
    )
    rows: list[dict[str, Any]] = []
    eta = _Eta(len(configs) * len(concurrencies))
    with contextlib.ExitStack() as stack:
        current: dict[str, Any] = {}

        def evaluate(config: ServerConfig, concurrency: int) -> Trial:
            if current.get("config") != config:
                stack.close()  # the previous configuration's server
                current.clear()
                folder = out / "servers" / config_label(config)
                try:
                    current["server"] = stack.enter_context(
                        start_server("ferry", model, config, folder)
                    )
                except ServerFailed as failure:
                    current["failure"] = str(failure)
                current["config"] = config
                if "server" in current:
                    warm_up(current["server"].inference_url, name, spec)
            if "failure" in current:
                row = failed_row(spec, concurrency, config, current["failure"])
                trial = Trial(config, concurrency, 0.0, math.inf, 1.0, current["failure"])
            else:
                server = current["server"]
                requests = args.requests or requests_for_percentile(99, concurrency)
                point = dataclasses.replace(spec, requests=requests)
                row = measure(
                    server.inference_url, server.metrics_url, name, point, concurrency, config
                )
                p99 = row["Latency P99"] if row["Latency P99"] is not None else math.inf
                trial = Trial(config, concurrency, row["Throughput"], p99, row["Error rate"])
            rows.append(row)
            print(f"{_row_line(row)} ({eta.step()})", file=sys.stderr)
            return trial

        result = search(evaluate, configs, concurrencies, slo_ms)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "tune.csv")
    chosen = result.best
    title = f"ferry bench tune: {model.name}, p99 SLO {slo_ms:g} ms"
    plot_throughput_against_p99(rows, out / "tune.png", title, slo_ms, chosen=chosen)
    if chosen is None:
        failures = sorted({t.failure for t in result.trials if t.failure})
        print(f"no configuration met p99 <= {slo_ms:g} ms; see {out / 'tune.csv'}")
        for failure in failures:
            print(f"  a configuration failed: {failure}")
        return 1
    (out / "model-config.yaml").write_text(model_config_yaml(chosen, slo_ms, base_config))
    ranked = [chosen, *result.runners_up]
    table = [
        {
            "rank": i + 1,
            "Batch size": t.config.batch_size,
            "Batch delay": t.config.max_batch_delay,
            "Workers": t.config.workers,
            "Precision": t.config.precision,
            "Concurrency": t.concurrency,
            "Goodput (req/s)": t.throughput,
            "p99 (ms)": t.p99_ms,
        }
        for i, t in enumerate(ranked)
    ]
    text = markdown_table(table, list(table[0]))
    (out / "tune.md").write_text(f"# Tune: {model.name}, p99 SLO {slo_ms:g} ms\n\n{text}\n")
    print(text)
    print(f"wrote {out / 'model-config.yaml'}: the archive's configuration with")
    for line in config_changes(base_config, tuned_config(base_config, chosen.config)):
        print(f"  {line}")
    if args.archive:
        with tempfile.TemporaryDirectory() as work:
            folder = copy_with_config(
                model, Path(work) / name, lambda d: d.update(tuned_config(d, chosen.config))
            )
            archive = zip_folder(folder, out / f"{name}.mar")
        print(f"wrote {archive}: the model with that configuration, ready to serve")
    return 0


def run_limit_command(args: argparse.Namespace) -> int:
    from ferry.bench.limit_report import write_limit_report
    from ferry.bench.limit_run import LimitSpec, default_settings, echo, measure_limit
    from ferry.bench.servers import ServerFailed

    try:
        slo_ms = _duration_ms(args.slo_p99)
        inputs = [Path(p).resolve() for p in args.input.split(",") if p]
        if slo_ms <= 0 or not inputs or not all(p.is_file() for p in inputs):
            raise ValueError("the SLO must be positive and every input a file")
        fractions = _floats(args.fractions, "--fractions")
        rates = sorted(_floats(args.rates, "--rates")) if args.rates else None
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
