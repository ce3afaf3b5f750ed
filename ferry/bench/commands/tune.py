"""``ferry bench tune``: the highest throughput whose p99 meets an SLO (``ferry.bench.tune``);
writes the tuned model-config.yaml."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from ferry.bench.commands.arguments import duration_ms, int_list
from ferry.bench.commands.progress import Eta, row_line

HELP: str = "highest throughput whose p99 meets an SLO; writes model-config.yaml"
DESCRIPTION: str | None = None
NEEDS: tuple[str, ...] = ("aiohttp", "httpx", "matplotlib")
"""The bench extra's modules this command imports (checked before it starts)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="a .mar, .tar.gz or model folder")
    parser.add_argument("--slo-p99", required=True, help="e.g. 100ms or 0.1s")
    parser.add_argument("--input", required=True, help="comma-separated request bodies")
    parser.add_argument("--content-type", default="application/octet-stream")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16")
    parser.add_argument("--delays", default="5,20", help="max_batch_delay values (ms)")
    parser.add_argument("--workers", default=None, help="default: 1 and the core count")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32")
    parser.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16,bf16")
    parser.add_argument(
        "--requests",
        type=int,
        help="per measurement (default: enough for ten answers beyond p99, and ten per client)",
    )
    parser.add_argument("--out", type=Path, default=Path("tune-results"))
    parser.add_argument(
        "--archive",
        action="store_true",
        help="also write OUT/NAME.mar: the model with the tuned configuration",
    )


def run(args: argparse.Namespace) -> int:
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
        slo_ms = duration_ms(args.slo_p99)
        batch_sizes, delays = int_list(args.batch_sizes), int_list(args.delays, minimum=0)
        workers = int_list(args.workers) if args.workers else sorted({1, available_cores()})
        concurrencies = int_list(args.concurrency)
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
    eta = Eta(len(configs) * len(concurrencies))
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
            print(f"{row_line(row)} ({eta.step()})", file=sys.stderr)
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
