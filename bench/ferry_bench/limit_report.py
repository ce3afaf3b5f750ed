"""A limit report as Markdown, JSON and a plot of latency against offered load."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from ferry_bench.figures import few_answers
from ferry_bench.latency_plot import plot_latency_against_load
from ferry_bench.limit_run import LimitReport, RatePoint


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def ratios(report: LimitReport) -> dict[str, float | None]:
    limits = report.bounds
    return {
        "low_load_p50_minus_floor_ms": report.low_load_gap_ms,
        "peak_goodput_over_ceiling": report.peak_goodput / limits.ceiling_sequential,
        "peak_goodput_over_pipelined_ceiling": report.peak_goodput / limits.ceiling_pipelined,
        "goodput_within_slo_over_slo_capacity": (
            report.goodput_within_slo / limits.slo_capacity if limits.slo_capacity else None
        ),
    }


def machine() -> str:
    return (
        f"{platform.machine()}, {os.cpu_count()} cores shared by server and load generator; "
        f"profiled with {torch.get_num_threads()} torch threads; "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )


def markdown(report: LimitReport, title: str) -> str:
    spec, limits = report.spec, report.bounds
    found = ratios(report)
    lines = [
        f"# Limit report: {title}",
        "",
        f"Machine: {machine()}.",
        f"Server: {spec.url or 'Ferry, started by ferry bench limit'}"
        + (f", batch policy {spec.batch_policy}" if spec.batch_policy else "")
        + "; batch size "
        f"{spec.batch_size}, max batch delay {spec.max_batch_delay} ms, {spec.workers} "
        f"worker(s). p99 SLO {spec.slo_ms:g} ms. Poisson arrivals, seed {spec.seed}, "
        f"{spec.seconds:g} s per rate.",
        "",
        *_warning_lines(limit_warnings(report)),
        "## The model's costs (offline profile, median ms per batch)",
        "",
        "| batch | " + " | ".join(next(iter(report.costs.values()))) + " | total | items/s |",
        "|---|" + "---|" * (len(next(iter(report.costs.values()))) + 2),
    ]
    for batch, stages in sorted(report.costs.items()):
        total = sum(stages.values())
        cells = " | ".join(f"{v:.2f}" for v in stages.values())
        lines.append(f"| {batch} | {cells} | {total:.2f} | {batch * 1000 / total:.1f} |")
    lines += [
        "",
        "## Bounds",
        "",
        f"- round trip r: {report.round_trip_ms:.2f} ms ({report.round_trip_source})",
        f"- latency floor L0 = cost(1) + r: **{limits.floor_ms:.2f} ms**",
        f"- throughput ceiling X*: **{limits.ceiling_sequential:.1f} req/s** (batch "
        f"{limits.best_batch}, stages in sequence); {limits.ceiling_pipelined:.1f} req/s if "
        "stages overlapped perfectly",
        "- SLO-bounded capacity X_SLO (best b/cost(b) with 2 x cost(b) <= SLO): "
        + (
            f"**{limits.slo_capacity:.1f} req/s** (batch {limits.slo_batch})"
            if limits.slo_capacity
            else "none: even a batch of one costs more than half the SLO"
        ),
        "",
        "## Ratios",
        "",
        f"- low-load p50 - L0: **{_ms(found['low_load_p50_minus_floor_ms'])} ms**",
        f"- peak goodput / X*: **{found['peak_goodput_over_ceiling']:.2f}** "
        f"({report.peak_goodput:.1f} req/s at {report.peak_concurrency} clients; "
        f"{found['peak_goodput_over_pipelined_ceiling']:.2f} of the pipelined ceiling)",
        "- goodput within the SLO / X_SLO: **"
        + (
            f"{found['goodput_within_slo_over_slo_capacity']:.2f}"
            if found["goodput_within_slo_over_slo_capacity"] is not None
            else "-"
        )
        + f"** ({report.goodput_within_slo:.1f} req/s: the best goodput at a rate whose p99 "
        "met the SLO)",
        "",
        "## Per offered load: the server beside an ideal dispatcher fed the same arrivals",
        "",
        "The ideal dispatcher has no overhead but r, never idles while requests wait, never "
        "waits to fill a batch, and pays the profiled cost(b) (a size not profiled pays the "
        "next size up).",
        "",
        "| offered req/s | goodput req/s | p50 ms | ideal p50 ms | p99 ms | ideal p99 ms | "
        "p99 / ideal | ideal mean batch | error rate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point in report.points:
        over = (
            f"{point.p99_ms / point.ideal_p99_ms:.2f}"
            if point.p99_ms is not None and point.ideal_p99_ms > 0
            else "-"
        )
        lines.append(
            f"| {point.offered:.1f} | {point.goodput:.1f} | {_ms(point.p50_ms)} | "
            f"{point.ideal_p50_ms:.1f} | {_ms(point.p99_ms)} | {point.ideal_p99_ms:.1f} | "
            f"{over} | {point.ideal_mean_batch:.2f} | {point.error_rate:.2%} |"
        )
    return "\n".join(lines + _core_use_lines(report)) + "\n"


SHARE_WORTH_A_WARNING = 0.25
"""A share of the machine's cores taken by the load generator, or by processes that are
neither it nor the server, above which the report warns that its ratios are skewed."""


def limit_warnings(report: LimitReport) -> list[str]:
    """What makes this report's figures less than they seem, worst first: written in
    ``limit.md`` and drawn on ``limit.png`` alike."""
    limits, warnings = report.bounds, []
    if report.peak_goodput > 1.05 * limits.ceiling_sequential:
        warnings.append(
            f"peak goodput / X* is {report.peak_goodput / limits.ceiling_sequential:.2f}, above "
            "the ceiling: the profiled costs were higher than the server's (a busy machine "
            "while profiling? rerun with more --profile-seconds); read the ratios with that "
            "in mind"
        )
    failing = [p for p in report.points if p.error_rate > 0]
    if failing:
        listed = ", ".join(f"{p.offered:.1f}/s: {p.error_rate:.0%}" for p in failing)
        warnings.append(f"requests failed at {listed}; latencies are of successful answers")
    return warnings + _core_warnings(report) + _sample_warnings(report)


def _core_warnings(report: LimitReport) -> list[str]:
    measured = [(p, p.core_use) for p in report.points if p.core_use is not None]
    warnings = []
    for point, used in measured:
        share = used.generator_cores / used.cores
        if share > SHARE_WORTH_A_WARNING:
            warnings.append(
                f"client-bound: the load generator used {used.generator_cores:.2f} of "
                f"{used.cores} cores ({share:.0%}) at {point.offered:.1f}/s, cores X* counts "
                "as the model's"
            )
            break
    for point, used in measured:
        if used.server_main_ms is None or used.server_workers_ms is None:
            continue
        server = (used.server_main_ms + used.server_workers_ms) * point.goodput / 1000
        others = used.cores_busy - used.generator_cores - server
        if others / used.cores > SHARE_WORTH_A_WARNING:
            warnings.append(
                f"busy machine: other processes used {others:.2f} of {used.cores} cores at "
                f"{point.offered:.1f}/s; rerun on a quieter machine"
            )
            break
    return warnings


def _sample_warnings(report: LimitReport) -> list[str]:
    thin = [p for p in report.points if p.p99_ms is not None and few_answers(answered(report, p))]
    if not thin:
        return []
    listed = ", ".join(f"{p.offered:.1f}/s" for p in thin)
    return [
        f"too few samples: p99 rests on fewer than 10 answers beyond it at {listed}; give a "
        "longer --duration"
    ]


def answered(report: LimitReport, point: RatePoint) -> int:
    """The successful answers behind a rate's percentiles (goodput over the rate's run)."""
    return round(point.goodput * report.spec.seconds)


def _warning_lines(warnings: list[str]) -> list[str]:
    if not warnings:
        return []
    return ["## Warnings", "", *(f"- {warning}" for warning in warnings), ""]


def _core_use_lines(report: LimitReport) -> list[str]:
    """Who used the cores per offered load, where it was measured."""
    measured = [(p.offered, p.core_use) for p in report.points if p.core_use is not None]
    if not measured:
        return []
    cores = measured[0][1].cores
    busiest_rate, busiest = max(measured, key=lambda pair: pair[1].generator_cores)
    lines = [
        "",
        f"## Who used the {'core' if cores == 1 else f'{cores} cores'} (per offered load)",
        "",
        _generator_sentence(report, cores, busiest_rate, busiest.generator_cores),
        "",
        "Cores busy counts everything that ran on them; CPU time is per answered request.",
        "",
        "| offered req/s | cores busy | load generator: cores | load generator ms CPU / "
        "request | server's main process ms CPU / request | workers ms CPU / request |",
        "|---|---|---|---|---|---|",
    ]
    for offered, used in measured:
        lines.append(
            f"| {offered:.1f} | {used.cores_busy:.2f} | {used.generator_cores:.2f} | "
            f"{_ms2(used.generator_ms)} | {_ms2(used.server_main_ms)} | "
            f"{_ms2(used.server_workers_ms)} |"
        )
    if any(used.server_workers_ms is not None for _, used in measured):
        lines += [
            "",
            "A worker's CPU time counts torch's threads spinning while they wait for the next "
            "operation: it can exceed the profiled cost times the threads.",
        ]
    return lines


def _generator_sentence(report: LimitReport, cores: int, rate: float, used: float) -> str:
    most = f"{used:.2f} cores ({used / cores:.0%} of the machine, at {rate:.1f} req/s)"
    if report.spec.url is None:
        every = {1: "its one core", 2: "both cores"}.get(cores, f"all {cores} cores")
        return (
            f"X* gives the model {every}, but the load generator ran on the same machine as "
            f"the server and used up to {most}."
        )
    return (
        f"The load generator used up to {most}; where the server runs on this machine "
        f"too, X* counts those cores as the model's."
    )


def _ms2(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def document(report: LimitReport) -> dict[str, Any]:
    return {
        "spec": {
            key: str(value) if isinstance(value, Path) else value
            for key, value in dataclasses.asdict(report.spec).items()
            if key != "inputs"
        }
        | {"inputs": [str(p) for p in report.spec.inputs]},
        "costs_ms": {str(b): stages for b, stages in report.costs.items()},
        "round_trip_ms": report.round_trip_ms,
        "bounds": dataclasses.asdict(report.bounds),
        "peak_goodput": report.peak_goodput,
        "ratios": ratios(report),
        "points": [dataclasses.asdict(p) for p in report.points],
    }


def write_limit_report(report: LimitReport, out: Path, title: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js, png = out / "limit.md", out / "limit.json", out / "limit.png"
    md.write_text(markdown(report, title))
    js.write_text(json.dumps(document(report), indent=2))
    limits = report.bounds
    ceiling, capacity = limits.ceiling_sequential, limits.slo_capacity
    if capacity == ceiling:
        marks = {f"X* = X_SLO {ceiling:.0f} req/s": ceiling}
    else:
        marks = {f"X* {ceiling:.0f} req/s": ceiling}
        if capacity is not None:
            marks[f"X_SLO {capacity:.0f} req/s"] = capacity
    plot_latency_against_load(
        {
            "server": [(p.offered, p.p50_ms, p.p99_ms) for p in report.points],
            "ideal": [(p.offered, p.ideal_p50_ms, p.ideal_p99_ms) for p in report.points],
        },
        png,
        f"ferry bench limit: {title} (batch {report.spec.batch_size}, "
        f"{report.spec.workers} worker(s), SLO p99 {report.spec.slo_ms:g} ms)",
        machine(),
        marks=marks,
        floor_ms=limits.floor_ms,
        slo_ms=report.spec.slo_ms,
        failures={"errors": [(p.offered, p.error_rate) for p in report.points]},
        warnings=limit_warnings(report),
    )
    return [md, js, png]
