"""Sweep and tune results as CSV, Markdown and a throughput-against-p99 plot."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry_bench.figures import apply_scale, axis_scale, draw_warnings, few_answers

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))  # failed rows have fewer
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:g}"
    return "-" if value is None else str(value)


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


MARKERS = "osD^v<>pXh*P"


def series_style(index: int) -> dict[str, Any]:
    """A colour and marker no other of the first 220 series shares (20 colours x 11
    markers), so a legend stays unambiguous beyond matplotlib's ten default colours."""
    import matplotlib

    colour = matplotlib.colormaps["tab20"](index % 20)
    return {"color": colour, "marker": MARKERS[(index // 20 + index) % 11]}


def conditions() -> str:
    """The machine a figure was measured on, for its footnote."""
    import os
    import platform

    import torch

    return f"measured on {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}"


def _workers(count: int) -> str:
    return f"{count} worker" if count == 1 else f"{count} workers"


def plot_throughput_against_p99(
    rows: list[dict[str, Any]],
    path: Path,
    title: str,
    slo_ms: float | None = None,
    chosen: Any = None,
    warnings: Sequence[str] = (),
) -> None:
    """``throughput_figure`` saved as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    figure = throughput_figure(rows, title, slo_ms, chosen, warnings)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def throughput_figure(
    rows: list[dict[str, Any]],
    title: str,
    slo_ms: float | None = None,
    chosen: Any = None,
    warnings: Sequence[str] = (),
) -> Figure:
    """Goodput against p99, one series per configuration (points: concurrency); the SLO
    as a line, ``chosen`` (a tune ``Trial``) ringed and named, ``warnings`` in red and
    the machine in a footnote. Each axis is log only over a decade or more."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5.5))

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (row["Batch size"], row["Batch delay"], row["Workers"], row.get("Precision", "fp32"))

    for index, (batch, delay, workers, precision) in enumerate(sorted({key(r) for r in rows})):
        series = [
            r
            for r in rows
            if key(r) == (batch, delay, workers, precision) and r["Latency P99"] is not None
        ]
        if not series:
            continue
        axes.plot(
            [r["Latency P99"] for r in series],
            [r["Throughput"] for r in series],
            label=f"batch {batch}, delay {delay} ms, {_workers(workers)}, {precision}",
            **series_style(index),
        )
        for r in series:
            axes.annotate(
                f"c{r['Concurrency']}",
                (r["Latency P99"], r["Throughput"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(4, -9),
            )
    if slo_ms is not None:
        axes.axvline(slo_ms, color="red", linestyle="--", label=f"p99 SLO {slo_ms:g} ms")
    if chosen is not None:
        axes.scatter(
            [chosen.p99_ms],
            [chosen.throughput],
            s=260,
            facecolors="none",
            edgecolors="black",
            linewidths=2,
            zorder=5,
            label=(
                f"chosen: batch {chosen.config.batch_size}, delay "
                f"{chosen.config.max_batch_delay} ms, {_workers(chosen.config.workers)}, "
                f"{chosen.config.precision}, c{chosen.concurrency}"
            ),
        )
    measured = [r for r in rows if r["Latency P99"] is not None]
    x_scale = axis_scale([r["Latency P99"] for r in measured] + [slo_ms])
    y_scale = axis_scale([r["Throughput"] for r in measured])
    apply_scale(axes, "x", x_scale)
    apply_scale(axes, "y", y_scale)
    axes.set_xlabel(f"p99 latency of successful answers (ms{x_scale.note})")
    axes.set_ylabel(f"goodput (successful answers/s{y_scale.note})")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    figure.text(0.01, 0.01, conditions(), fontsize=7, color="dimgray")
    top_of_warnings = draw_warnings(figure, warnings)
    figure.tight_layout(rect=(0, top_of_warnings, 1, 1))
    return figure


def row_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """What a sweep's or tune's reader must know: configurations that did not start,
    points with failed requests, p99s on too few answers."""
    warnings = []
    failed = sorted({_label(r) for r in rows if r.get("Error")})
    if failed:
        warnings.append(f"did not start: {', '.join(failed)} (the reason: the report's Error)")
    erring = [r for r in rows if not r.get("Error") and (r.get("Error rate") or 0) > 0]
    if erring:
        listed = ", ".join(f"{_label(r)} c{r['Concurrency']} {r['Error rate']:.0%}" for r in erring)
        warnings.append(f"requests failed at {listed}")
    thin = [
        r for r in rows if not r.get("Error") and few_answers(r["Requests"] - r["Failed requests"])
    ]
    if thin:
        listed = ", ".join(f"{_label(r)} c{r['Concurrency']}" for r in thin)
        warnings.append(f"p99 rests on fewer than 10 answers beyond it at {listed}")
    return warnings


def _label(row: dict[str, Any]) -> str:
    return (
        f"b{row['Batch size']}-d{row['Batch delay']}-w{row['Workers']}-"
        f"{row.get('Precision', 'fp32')}"
    )


def warning_section(warnings: Sequence[str]) -> str:
    """A report's warnings as Markdown, before its table; nothing when there are none."""
    if not warnings:
        return ""
    return "## Warnings\n\n" + "".join(f"- {w}\n" for w in warnings) + "\n"


SUMMARY_COLUMNS = [
    "Batch size",
    "Batch delay",
    "Workers",
    "Precision",
    "Concurrency",
    "Throughput",
    "Latency P50",
    "Latency P99",
    "Error rate",
    "Model_p50",
    "Queue time p50",
    "Error",
]


def write_sweep_reports(rows: list[dict[str, Any]], out: Path, title: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path, png_path = out / "sweep.csv", out / "sweep.md", out / "sweep.png"
    write_csv(rows, csv_path)
    warnings = row_warnings(rows)
    md_path.write_text(
        f"# Sweep: {title}\n\n{warning_section(warnings)}"
        f"{markdown_table(rows, SUMMARY_COLUMNS)}\n\n"
        f"All columns: `sweep.csv`. Plot: `sweep.png`.\n"
    )
    plot_throughput_against_p99(rows, png_path, title, warnings=warnings)
    return [csv_path, md_path, png_path]
