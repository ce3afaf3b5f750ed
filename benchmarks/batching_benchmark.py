"""Ferry's batch policies side by side on the same arrivals, beside the ideal dispatcher:
``ferry bench limit`` once per policy (adaptive, immediate, fixed_window) on the ResNet-18
archive and on the demo model, every policy offered the same Poisson traces (the rates the
first run derived from its profile, and one seed).

Writes ``benchmarks/results/batching.md`` and ``batching_<model>.png`` (p99 against offered
load per policy, and the ideal's), with each run's full report under
``benchmarks/results/batching_<model>/<policy>/``.
Run: ``python benchmarks/batching_benchmark.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.common import (
    ROOT,
    ferry_bench_limit,
    jpeg_inputs,
    machine_description,
    resnet18_archive,
)
from ferry_bench.latency_plot import plot_latency_against_load

RESULTS = ROOT / "benchmarks" / "results"
POLICIES = ("adaptive", "immediate", "fixed_window")
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95)


def limit(model: Path, inputs: list[Path], slo: str, out: Path, *extra: str) -> dict[str, Any]:
    ferry_bench_limit(model, inputs, slo, out, *extra)
    report: dict[str, Any] = json.loads((out / "limit.json").read_text())
    return report


def compare(
    title: str, model: Path, inputs: list[Path], slo: str, folder: Path, *extra: str
) -> tuple[str, Path]:
    """Every policy on the same rates; a Markdown section and the plot's path."""
    reports: dict[str, dict[str, Any]] = {}
    first = POLICIES[0]
    fractions = ",".join(map(str, FRACTIONS))
    reports[first] = limit(
        model,
        inputs,
        slo,
        folder / first,
        "--batch-policy",
        first,
        "--fractions",
        fractions,
        *extra,
    )
    rates = ",".join(f"{p['offered']:.3f}" for p in reports[first]["points"])
    for policy in POLICIES[1:]:
        reports[policy] = limit(
            model, inputs, slo, folder / policy, "--batch-policy", policy, "--rates", rates, *extra
        )
    return section(title, reports, folder), plot(title, reports, folder)


def plot(title: str, reports: dict[str, dict[str, Any]], folder: Path) -> Path:
    """p50/p99 against offered load per policy and the ideal's: ``batching_<model>.png``."""
    ideal = reports[POLICIES[0]]
    series = {
        policy: [(p["offered"], p["p50_ms"], p["p99_ms"]) for p in report["points"]]
        for policy, report in reports.items()
    }
    series["ideal"] = [
        (p["offered"], p["ideal_p50_ms"], p["ideal_p99_ms"]) for p in ideal["points"]
    ]
    png = RESULTS / f"{folder.name}.png"
    bounds = ideal["bounds"]
    plot_latency_against_load(
        series,
        png,
        f"Batch policies: {title}",
        machine_description(),
        marks={f"X* {bounds['ceiling_sequential']:.0f} req/s": bounds["ceiling_sequential"]},
        floor_ms=bounds["floor_ms"],
        slo_ms=ideal["spec"]["slo_ms"],
    )
    return png


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def section(title: str, reports: dict[str, dict[str, Any]], folder: Path) -> str:
    ideal = reports[POLICIES[0]]
    bounds = ideal["bounds"]
    lines = [
        f"## {title}",
        "",
        f"Bounds from the adaptive run's profile: L0 {bounds['floor_ms']:.1f} ms, X* "
        f"{bounds['ceiling_sequential']:.1f} req/s, X_SLO "
        f"{bounds['slo_capacity'] or 0:.1f} req/s (p99 SLO {ideal['spec']['slo_ms']:g} ms). "
        "Each policy's own report: "
        + ", ".join(f"[{p}]({folder.name}/{p}/limit.md)" for p in reports)
        + ".",
        "",
        "p50 / p99 in ms per offered load (the ideal dispatcher on the adaptive run's "
        "arrivals and profile):",
        "",
        "| offered req/s | " + " | ".join(reports) + " | ideal |",
        "|---|" + "---|" * (len(reports) + 1),
    ]
    for index, point in enumerate(ideal["points"]):
        cells = []
        for report in reports.values():
            mine = report["points"][index]
            cells.append(f"{_ms(mine['p50_ms'])} / {_ms(mine['p99_ms'])}")
        cells.append(f"{point['ideal_p50_ms']:.1f} / {point['ideal_p99_ms']:.1f}")
        lines.append(f"| {point['offered']:.1f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Ratios against the same bounds (the adaptive run's profile: each run's own profile "
        "varies by up to ~20% on this shared machine, which would blur a comparison):",
        "",
        "| ratio | " + " | ".join(reports) + " |",
        "|---|" + "---|" * len(reports),
    ]
    slo = ideal["spec"]["slo_ms"]
    rows: dict[str, list[str]] = {"low-load p50 - L0 (ms)": [], "peak goodput / X*": []}
    rows["goodput within the SLO / X_SLO"] = []
    for report in reports.values():
        lowest = report["points"][0]["p50_ms"]
        rows["low-load p50 - L0 (ms)"].append(
            "-" if lowest is None else f"{lowest - bounds['floor_ms']:.1f}"
        )
        rows["peak goodput / X*"].append(
            f"{report['peak_goodput'] / bounds['ceiling_sequential']:.2f}"
        )
        within = [
            p["goodput"]
            for p in report["points"]
            if p["p99_ms"] is not None and p["p99_ms"] <= slo and p["error_rate"] == 0
        ]
        capacity = bounds["slo_capacity"]
        rows["goodput within the SLO / X_SLO"].append(
            f"{max(within, default=0.0) / capacity:.2f}" if capacity else "-"
        )
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows.items()]
    return "\n".join(lines)


def rebuild() -> None:
    """``--report-only``: batching.md and the plots again from the saved reports."""
    sections = []
    for folder, title in (
        (RESULTS / "batching_resnet18", "ResNet-18 (batch 8, maxBatchDelay 50 ms)"),
        (RESULTS / "batching_demo", "demo model (batch 8, maxBatchDelay 10 ms)"),
    ):
        reports = {p: json.loads((folder / p / "limit.json").read_text()) for p in POLICIES}
        sections.append((section(title, reports, folder), plot(title, reports, folder)))
    write(sections)


def write(sections: list[tuple[str, Path]]) -> None:
    (RESULTS / "batching.md").write_text(
        "# Batch policies against the ideal dispatcher\n\n"
        f"Machine: {machine_description()}; the server and the load generator share its "
        "cores. Command: `python benchmarks/batching_benchmark.py` (one run): `ferry bench "
        "limit` per policy, one worker, the same seed and offered rates for every policy "
        "(`--report-only` rebuilds this page from the saved reports).\n\n"
        + "\n\n".join(f"{text}\n\n![]({png.name})" for text, png in sections)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild batching.md from the reports a previous run saved; measure nothing",
    )
    if parser.parse_args().report_only:
        rebuild()
        return
    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        archive = store / resnet18_archive(store, batch_size=8, max_batch_delay_ms=50)
        images = []
        for index, jpeg in enumerate(jpeg_inputs(8, 224)):
            path = work / f"image{index}.jpg"
            path.write_bytes(jpeg)
            images.append(path)
        sections.append(
            compare(
                "ResNet-18 (batch 8, maxBatchDelay 50 ms)",
                archive,
                images,
                "1s",
                RESULTS / "batching_resnet18",
                "--duration",
                "15",
            )
        )
    demo = ROOT / "examples" / "demo"
    sections.append(
        compare(
            "demo model (batch 8, maxBatchDelay 10 ms)",
            demo / "model-store" / "shapes.mar",
            [demo / "samples" / "star.png"],
            "50ms",
            RESULTS / "batching_demo",
        )
    )
    write(sections)


if __name__ == "__main__":
    main()
