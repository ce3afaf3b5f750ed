"""Profile results as a printed table, CSV, JSON and a PNG plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ferry.bench.profile import ProfilePoint

COLUMNS = [
    "batch_size",
    "variant",
    "precision",
    "latency_ms_median",
    "latency_ms_p10",
    "latency_ms_p90",
    "ms_per_item",
    "items_per_second",
    "peak_memory_mb",
]


def format_table(points: list[ProfilePoint]) -> str:
    header = (
        f"{'batch':>6} {'variant':<8} {'prec':<5} {'median ms':>10} {'p10-p90 ms':>16} "
        f"{'ms/item':>9} {'items/s':>9} {'peak MB':>9}"
    )
    lines = [header, "-" * len(header)]
    for p in points:
        spread = f"{p.latency_ms_p10:.1f}-{p.latency_ms_p90:.1f}"
        lines.append(
            f"{p.batch_size:>6} {p.variant:<8} {p.precision:<5} {p.latency_ms_median:>10.2f} "
            f"{spread:>16} {p.ms_per_item:>9.3f} {p.items_per_second:>9.1f} "
            f"{p.peak_memory_mb:>9.0f}"
        )
    return "\n".join(lines)


def format_optimizations(active: dict[str, Any]) -> str:
    settings = ", ".join(f"{key}={value}" for key, value in active.items())
    return f"optimization: {settings or 'none'}"


def write_reports(
    points: list[ProfilePoint], out: Path, title: str, optimization: dict[str, Any] | None = None
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path, png_path = out / "profile.csv", out / "profile.json", out / "profile.png"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for point in points:
            writer.writerow(point.row())
    json_path.write_text(
        json.dumps(
            {
                "model": title,
                "optimization": optimization or {},
                "points": [p.row() for p in points],
            },
            indent=2,
        )
    )
    _plot(points, png_path, title)
    return [csv_path, json_path, png_path]


def _plot(points: list[ProfilePoint], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput, per_item) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = sorted({(p.variant, p.precision) for p in points})
    for variant, precision in series:
        selected = [p for p in points if (p.variant, p.precision) == (variant, precision)]
        sizes = [p.batch_size for p in selected]
        label = f"{variant} {precision}"
        throughput.plot(sizes, [p.items_per_second for p in selected], marker="o", label=label)
        per_item.plot(sizes, [p.ms_per_item for p in selected], marker="o", label=label)
    for axes, ylabel in ((throughput, "items / s"), (per_item, "ms per item")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("batch size")
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
        axes.legend()
    throughput.set_title("throughput")
    per_item.set_title("time per item")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
