"""Latency against offered load, with the share of requests that failed beneath: the plot
of ``bench load --rate R1,R2,...`` and ``bench limit``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ferry_bench.figures import apply_scale, axis_scale, draw_warnings

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Points = list[tuple[float, float | None, float | None]]
"""A series on a latency plot: (offered rate, p50 ms, p99 ms); None where none succeeded."""


def plot_latency_against_load(
    series: dict[str, Points],
    path: Path,
    title: str,
    notes: str,
    marks: dict[str, float] | None = None,
    floor_ms: float | None = None,
    slo_ms: float | None = None,
    failures: dict[str, list[tuple[float, float]]] | None = None,
    warnings: Sequence[str] = (),
) -> None:
    """``latency_figure`` saved as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    figure = latency_figure(series, title, notes, marks, floor_ms, slo_ms, failures, warnings)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def latency_figure(
    series: dict[str, Points],
    title: str,
    notes: str,
    marks: dict[str, float] | None = None,
    floor_ms: float | None = None,
    slo_ms: float | None = None,
    failures: dict[str, list[tuple[float, float]]] | None = None,
    warnings: Sequence[str] = (),
) -> Figure:
    """p50 (solid) and p99 (dashed) of successful answers against offered load for each
    series (``name: [(rate, p50, p99)]``); ``marks`` are vertical lines (capacities),
    ``floor_ms`` a horizontal one. Below, the share of requests that failed per rate
    (``failures``: kind -> [(rate, share 0..1)]), so a run that mostly failed does not
    look fast; ``warnings`` in red at the foot. The latency axis is log only over a decade
    or more, and labelled either way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (axes, failed) = plt.subplots(
        2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    colours = matplotlib.colormaps["tab10"]
    latencies: list[float | None] = [floor_ms, slo_ms]
    for index, (name, points) in enumerate(series.items()):
        rates = [rate for rate, _, _ in points]
        for position, (label, style, marker) in enumerate((("p50", "-", "o"), ("p99", "--", "s"))):
            values = [p[1 + position] for p in points]
            xs = [r for r, v in zip(rates, values, strict=True) if v is not None]
            ys = [v for v in values if v is not None]
            latencies += ys
            axes.plot(
                xs,
                ys,
                linestyle=style,
                marker=marker,
                color=colours(index),
                label=f"{name} {label}",
            )
    for position, (label, value) in enumerate((marks or {}).items()):
        axes.axvline(value, color="gray", linestyle=(0, (1, 1 + position)), label=label)
        failed.axvline(value, color="gray", linestyle=(0, (1, 1 + position)))
    if slo_ms is not None:
        axes.axhline(slo_ms, color="red", linestyle="--", label=f"p99 SLO {slo_ms:g} ms")
    if floor_ms is not None:
        axes.axhline(
            floor_ms, color="black", linestyle=":", label=f"latency floor L0 {floor_ms:.1f} ms"
        )
    scale = axis_scale(latencies)
    apply_scale(axes, "y", scale)
    rates_seen = [rate for points in series.values() for rate, _, _ in points]
    apply_scale(failed, "x", axis_scale(rates_seen))
    axes.set_ylabel(f"latency of successful answers (ms{scale.note})")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, loc="upper left")
    _failure_panel(failed, failures or {})
    failed.set_xlabel("offered load (requests/s, Poisson)")
    figure.text(0.01, 0.01, notes, fontsize=7, color="dimgray")
    top_of_warnings = draw_warnings(figure, warnings)
    figure.tight_layout(rect=(0, top_of_warnings, 1, 1))
    return figure


def _failure_panel(panel: Axes, failures: dict[str, list[tuple[float, float]]]) -> None:
    """The share of requests that failed per offered rate, one line per kind of failure."""
    colours = {"503 (shed)": "tab:orange", "other errors": "tab:red", "errors": "tab:red"}
    worst = 0.0
    for kind, points in failures.items():
        shares = [100 * share for _, share in points]
        worst = max([worst, *shares])
        panel.plot(
            [rate for rate, _ in points],
            shares,
            marker="v",
            color=colours.get(kind, "tab:purple"),
            label=f"{kind}",
        )
    panel.set_ylim(0, 100 if worst > 10 else 10.5)
    panel.set_ylabel("failed (% of sent)")
    panel.grid(True, alpha=0.3)
    if worst == 0:
        panel.text(0.5, 0.5, "no request failed", transform=panel.transAxes, ha="center")
    if failures:
        panel.legend(fontsize=7, loc="best")
