"""Profile results as a printed table, CSV, JSON and a PNG plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ferry_bench.profile import NOISY_SPREAD, ProfilePoint

COLUMNS = [
    "batch_size",
    "variant",
    "precision",
    "latency_ms_median",
    "latency_ms_p10",
    "latency_ms_p90",
    "ms_per_item",
    "items_per_second",
    "memory_mb",
    "spread",
    "runs",
]


def format_table(points: list[ProfilePoint]) -> str:
    header = (
        f"{'batch':>6} {'variant':<8} {'prec':<5} {'median ms':>10} {'p10-p90 ms':>16} "
        f"{'ms/item':>9} {'items/s':>9} {'+MB':>7} {'runs':>5}"
    )
    lines = [header, "-" * len(header)]
    for p in points:
        spread = f"{p.latency_ms_p10:.1f}-{p.latency_ms_p90:.1f}"
        lines.append(
            f"{p.batch_size:>6} {p.variant:<8} {p.precision:<5} {p.latency_ms_median:>10.2f} "
            f"{spread:>16} {p.ms_per_item:>9.3f} {p.items_per_second:>9.1f} "
            f"{p.memory_mb:>7.1f} {p.runs:>5}" + ("  noisy" if p.spread > NOISY_SPREAD else "")
        )
    return "\n".join(lines)


def format_optimizations(active: dict[str, Any]) -> str:
    settings = ", ".join(f"{key}={value}" for key, value in active.items())
    return f"optimization: {settings or 'none'}"


def write_reports(
    points: list[ProfilePoint],
    out: Path,
    title: str,
    optimization: dict[str, Any] | None = None,
    conditions: str = "",
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
                "conditions": conditions,
                "optimization": optimization or {},
                "points": [p.row() for p in points],
            },
            indent=2,
        )
    )
    _plot(points, png_path, title, conditions)
    return [csv_path, json_path, png_path]


def _plot(points: list[ProfilePoint], path: Path, title: str, conditions: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput, per_item) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = sorted({(p.variant, p.precision) for p in points})
    for variant, precision in series:
        selected = [p for p in points if (p.variant, p.precision) == (variant, precision)]
        sizes = [p.batch_size for p in selected]
        label = f"{variant} {precision}"
        line = throughput.plot(
            sizes, [p.items_per_second for p in selected], marker="o", label=label
        )[0]
        # p10-p90 of the batch timings, as a band: items/s at p90 time is the low edge
        throughput.fill_between(
            sizes,
            [p.batch_size * 1000 / p.latency_ms_p90 for p in selected],
            [p.batch_size * 1000 / p.latency_ms_p10 for p in selected],
            color=line.get_color(),
            alpha=0.15,
        )
        per_item.plot(sizes, [p.ms_per_item for p in selected], marker="o", label=label)
        per_item.fill_between(
            sizes,
            [p.latency_ms_p10 / p.batch_size for p in selected],
            [p.latency_ms_p90 / p.batch_size for p in selected],
            color=line.get_color(),
            alpha=0.15,
        )
    all_sizes = sorted({p.batch_size for p in points})
    for axes, ylabel in ((throughput, "items / s"), (per_item, "ms per item")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(all_sizes, [str(size) for size in all_sizes])  # 1, 2, 4, not 2^0
        axes.minorticks_off()
        axes.set_xlabel("batch size")
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
        axes.legend()
    throughput.set_title("throughput (band: p10-p90)")
    per_item.set_title("time per item (band: p10-p90)")
    figure.suptitle(title)
    figure.text(0.01, 0.01, conditions, fontsize=7, color="dimgray")
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)
