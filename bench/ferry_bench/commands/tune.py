"""``ferry bench tune``: the highest throughput whose p99 meets an SLO (``ferry_bench.tune``);
writes the tuned model-config.yaml."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry_bench.commands.arguments import duration_ms, int_list
from ferry_bench.commands.progress import row_line

if TYPE_CHECKING:  # the bench extra is imported when a command runs, not when it parses
    from ferry_bench.servers import ServerConfig
    from ferry_bench.sweep import SweepSpec
    from ferry_bench.tune import Trial, TuneResult
    from ferry_bench.tune_budget import Fitted, Grid, Progress

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
    parser.add_argument(
        "--budget",
        default="5m",
        help="the most the search may take, e.g. 5m, 90s, 1h (default 5m): the grid is "
        "thinned until its worst case fits, saying what was left out",
    )
    parser.add_argument(
        "--point-seconds",
        type=float,
        default=10.0,
        help="the longest one measurement runs (default 10): it stops at its requests or "
        "at this, whichever comes first",
    )
    parser.add_argument("--out", type=Path, default=Path("tune-results"))
    parser.add_argument(
        "--archive",
        action="store_true",
        help="also write OUT/NAME.mar: the model with the tuned configuration",
    )


@dataclass(frozen=True)
class _Search:
    """What the arguments ask: the grid, the SLO, the inputs and the time allowed."""

    slo_ms: float
    grid: Grid
    inputs: list[Path]
    budget_s: float
    point_s: float


def _search(args: argparse.Namespace) -> _Search:
    """The search from the arguments; ``ValueError`` saying what is wrong."""
    from ferry.config.settings import available_cores
    from ferry_bench.tune_budget import Grid, parse_budget

    slo_ms = duration_ms(args.slo_p99)
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
    if args.point_seconds <= 0:
        raise ValueError("--point-seconds must be positive")
    batch_sizes, delays = int_list(args.batch_sizes), int_list(args.delays, minimum=0)
    grid = Grid(batch_sizes, delays, workers, precisions, sorted(concurrencies))
    return _Search(slo_ms, grid, inputs, parse_budget(args.budget), args.point_seconds)


def _fit(search: _Search) -> Fitted:
    """The grid thinned to the budget, its estimate printed up front."""
    from ferry_bench.tune_budget import Costs, estimate_lines, fit_to_budget

    fitted = fit_to_budget(search.grid, Costs(point_s=search.point_s), search.budget_s)
    for line in estimate_lines(fitted, search.budget_s):
        print(f"ferry bench tune: {line}", file=sys.stderr)
    return fitted


def _warn_if_few_requests(requests: int | None) -> None:
    from ferry_bench.tune import requests_for_percentile

    if requests is not None and requests < requests_for_percentile(99, 1):
        print(
            f"ferry bench tune: warning: with {requests} requests per point, p99 rests "
            f"on the slowest {max(1, requests // 100)} answers; leave --requests out to "
            "measure enough for p99",
            file=sys.stderr,
        )


class _Trials:
    """Measures one (configuration, concurrency) point for the search, on a server of that
    configuration: started at its first point, stopped when the next configuration comes."""

    def __init__(
        self, stack: contextlib.ExitStack, spec: SweepSpec, out: Path, progress: Progress
    ) -> None:
        from ferry_bench.servers import model_identity

        self._stack, self._spec, self._out = stack, spec, out
        self._name, _ = model_identity(spec.model)
        self._current: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] = []
        self.progress = progress

    def __call__(self, config: ServerConfig, concurrency: int) -> Trial:
        from ferry_bench.sweep import failed_row, measure
        from ferry_bench.tune import Trial, requests_for_percentile

        current, spec = self._server_for(config), self._spec
        if "failure" in current:
            row = failed_row(spec, concurrency, config, current["failure"])
            trial = Trial(config, concurrency, 0.0, math.inf, 1.0, current["failure"])
        else:
            server = current["server"]
            requests = spec.requests or requests_for_percentile(99, concurrency)
            point = dataclasses.replace(spec, requests=requests)  # cut at spec.duration
            urls = server.inference_url, server.metrics_url
            row = measure(*urls, self._name, point, concurrency, config)
            p99 = row["Latency P99"] if row["Latency P99"] is not None else math.inf
            trial = Trial(config, concurrency, row["Throughput"], p99, row["Error rate"])
        self.rows.append(row)
        higher = sum(1 for c in spec.concurrency if c > concurrency)
        print(f"{row_line(row)} ({self.progress.step(higher)})", file=sys.stderr)
        return trial

    def _server_for(self, config: ServerConfig) -> dict[str, Any]:
        from ferry_bench.servers import ServerFailed, start_server
        from ferry_bench.sweep import config_label, warm_up

        current = self._current
        if current.get("config") == config:
            return current
        self._stack.close()  # the previous configuration's server
        current.clear()
        folder = self._out / "servers" / config_label(config)
        began = self.progress.now()
        try:
            server = start_server("ferry", self._spec.model, config, folder)
            current["server"] = self._stack.enter_context(server)
        except ServerFailed as failure:
            current["failure"] = str(failure)
        current["config"] = config
        if "server" in current:
            warm_up(current["server"].inference_url, self._name, self._spec)
        self.progress.started(self.progress.now() - began)
        return current


def run(args: argparse.Namespace) -> int:
    from ferry_bench.servers import model_config_document
    from ferry_bench.sweep import SweepSpec
    from ferry_bench.tune import search
    from ferry_bench.tune_budget import Costs, Progress, budget_notes

    try:
        asked = _search(args)
        fitted = _fit(asked)
    except ValueError as exc:
        print(f"ferry bench tune: {exc}", file=sys.stderr)
        return 2
    _warn_if_few_requests(args.requests)
    model, out, grid = args.model.resolve(), args.out.resolve(), fitted.grid
    spec = SweepSpec(
        model,
        asked.inputs,
        args.content_type,
        grid.batch_sizes,
        grid.delays,
        grid.workers,
        grid.concurrencies,
        grid.precisions,
        args.requests,
        asked.point_s,
        "ferry",
    )
    base_config = model_config_document(model)
    progress = Progress(grid, Costs(point_s=asked.point_s), asked.budget_s)
    with contextlib.ExitStack() as stack:
        trials = _Trials(stack, spec, out, progress)
        result = search(
            trials, grid.configurations(), grid.concurrencies, asked.slo_ms, fits=progress.fits
        )
    print(f"ferry bench tune: took {progress.elapsed_s:.0f} s", file=sys.stderr)
    notes = budget_notes(fitted, result.unmeasured, asked.budget_s)
    return _report(model, out, asked.slo_ms, trials.rows, result, base_config, args.archive, notes)


def _report(
    model: Path,
    out: Path,
    slo_ms: float,
    rows: list[dict[str, Any]],
    result: TuneResult,
    base_config: dict[str, Any],
    archive: bool,
    notes: list[str],
) -> int:
    """tune.csv, tune.png, tune.md (its warnings; with a configuration that met the SLO,
    it and the runners-up), model-config.yaml and the archive when asked; 1 when none met
    it. The warnings go on the plot as in tune.md, and are printed."""
    from ferry_bench.sweep_report import plot_throughput_against_p99, row_warnings, write_csv
    from ferry_bench.tune import model_config_yaml

    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "tune.csv")
    chosen, warnings = result.best, notes + row_warnings(rows)
    title = f"ferry bench tune: {model.name}, p99 SLO {slo_ms:g} ms"
    plot_throughput_against_p99(rows, out / "tune.png", title, slo_ms, chosen, warnings)
    for warning in warnings:
        print(f"ferry bench tune: warning: {warning}", file=sys.stderr)
    _write_ranking(model, out, slo_ms, [chosen, *result.runners_up] if chosen else [], warnings)
    if chosen is None:
        failures = sorted({t.failure for t in result.trials if t.failure})
        print(f"no configuration met p99 <= {slo_ms:g} ms; see {out / 'tune.csv'}")
        for failure in failures:
            print(f"  a configuration failed: {failure}")
        return 1
    (out / "model-config.yaml").write_text(model_config_yaml(chosen, slo_ms, base_config))
    _write_tuned(model, out, base_config, chosen, archive)
    return 0


def _write_ranking(
    model: Path, out: Path, slo_ms: float, ranked: list[Trial], warnings: list[str]
) -> None:
    from ferry_bench.sweep_report import markdown_table, warning_section

    heading = f"# Tune: {model.name}, p99 SLO {slo_ms:g} ms\n\n{warning_section(warnings)}"
    if not ranked:
        (out / "tune.md").write_text(f"{heading}No configuration met the SLO.\n")
        return

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
    (out / "tune.md").write_text(f"{heading}{text}\n")
    print(text)


def _write_tuned(
    model: Path, out: Path, base_config: dict[str, Any], chosen: Trial, archive: bool
) -> None:
    from ferry_bench.servers import copy_with_config, model_identity, zip_folder
    from ferry_bench.tune import config_changes, tuned_config

    print(f"wrote {out / 'model-config.yaml'}: the archive's configuration with")
    for line in config_changes(base_config, tuned_config(base_config, chosen.config)):
        print(f"  {line}")
    if archive:
        name, _ = model_identity(model)
        with tempfile.TemporaryDirectory() as work:
            folder = copy_with_config(
                model, Path(work) / name, lambda d: d.update(tuned_config(d, chosen.config))
            )
            written = zip_folder(folder, out / f"{name}.mar")
        print(f"wrote {written}: the model with that configuration, ready to serve")
