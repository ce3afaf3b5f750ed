"""Sweep and tune results as CSV, Markdown and a throughput-against-p99 plot."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:g}"
    return "-" if value is None else str(value)


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def plot_throughput_against_p99(
    rows: list[dict[str, Any]], path: Path, title: str, slo_ms: float | None = None
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (row["Batch size"], row["Batch delay"], row["Workers"], row.get("Precision", "fp32"))

    for batch, delay, workers, precision in sorted({key(r) for r in rows}):
        series = [
            r
            for r in rows
            if key(r) == (batch, delay, workers, precision) and r["Latency P99"] is not None
        ]
        axes.plot(
            [r["Latency P99"] for r in series],
            [r["Throughput"] for r in series],
            marker="o",
            label=f"batch {batch}, delay {delay} ms, {workers} workers, {precision}",
        )
        for r in series:
            axes.annotate(
                f"c{r['Concurrency']}",
                (r["Latency P99"], r["Throughput"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
    if slo_ms is not None:
        axes.axvline(slo_ms, color="red", linestyle="--", label=f"p99 SLO {slo_ms:g} ms")
    axes.set_xlabel("p99 latency (ms)")
    axes.set_ylabel("throughput (requests/s)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


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
]


def write_sweep_reports(rows: list[dict[str, Any]], out: Path, title: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path, png_path = out / "sweep.csv", out / "sweep.md", out / "sweep.png"
    write_csv(rows, csv_path)
    md_path.write_text(
        f"# Sweep: {title}\n\n{markdown_table(rows, SUMMARY_COLUMNS)}\n\n"
        f"All columns: `sweep.csv`. Plot: `sweep.png`.\n"
    )
    plot_throughput_against_p99(rows, png_path, title)
    return [csv_path, md_path, png_path]
