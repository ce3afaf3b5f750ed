"""The bench's plots tell the truth: value axes labelled whatever their range, failures
beside latencies, and every warning of a report drawn on its picture (Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from ferry_bench.core_use import CoreUse
from ferry_bench.figures import axis_scale, few_answers, plain_number, warning_texts
from ferry_bench.latency_plot import Points, latency_figure
from ferry_bench.limit import Bounds
from ferry_bench.limit_report import limit_warnings, markdown
from ferry_bench.limit_run import LimitReport, LimitSpec, RatePoint
from ferry_bench.load_report import failure_shares, rate_warnings
from ferry_bench.sweep_report import row_warnings, throughput_figure


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ([2500, 3100, 4400], "linear"),  # the rate sweep whose log axis had no label
        ([2.5, 24.9], "linear"),  # just under a decade
        ([20, 200], "log"),
        ([8, 1680], "log"),
        ([0, 5, 900], "linear"),  # a zero cannot go on a log axis
        ([None, float("nan")], "linear"),
    ],
)
def test_log_only_over_a_decade_or_more(values: list[float | None], kind: str) -> None:
    assert axis_scale(values).kind == kind


def _labels(values: list[float], which: str = "y") -> list[str]:
    import matplotlib.pyplot as plt

    from ferry_bench.figures import apply_scale

    figure, axes = plt.subplots()
    axes.plot(range(len(values)), values)
    apply_scale(axes, "y", axis_scale(values))
    figure.canvas.draw()
    labels = [t.get_text() for t in axes.get_yticklabels() if t.get_text()]
    plt.close(figure)
    return labels


@pytest.mark.parametrize(
    "values", [[2500, 4400], [2.5, 4.4], [11, 13], [8, 1680], [0.05, 40], [100, 120]]
)
def test_every_range_gets_tick_labels_as_plain_numbers(values: list[float]) -> None:
    labels = _labels(values)
    assert len(labels) >= 2, labels
    assert not any("^" in label or "e+" in label for label in labels), labels


def test_plain_numbers() -> None:
    assert [plain_number(v) for v in (1000, 2500, 0.05, 0, 12.5)] == [
        "1000",
        "2500",
        "0.05",
        "0",
        "12.5",
    ]


def _sweep(shed: list[float]) -> list[dict[str, object]]:
    rates = [50, 100, 200, 400]
    return [
        {
            "rate": rate,
            "requests_sent": 1000,
            "succeeded": round(1000 * (1 - share)),
            "errors": {"503": round(1000 * share)} if share else {},
            "error_rate": share,
        }
        for rate, share in zip(rates, shed, strict=True)
    ]


def test_a_rate_sweep_plots_its_sheds_and_warns_on_the_picture() -> None:
    import matplotlib.pyplot as plt

    summaries = _sweep([0.0, 0.72, 0.85, 0.89])
    failures = failure_shares(summaries)
    assert failures["503 (shed)"] == [(50, 0.0), (100, 0.72), (200, 0.85), (400, 0.89)]
    warnings = rate_warnings(summaries)
    assert "100/s: 72% (720 x 503)" in warnings[0]
    assert "fewer than 10 answers" in warnings[1]  # 110 answers at 400/s
    points: Points = [(50.0, 2500.0, 3100.0), (100.0, 2900.0, 3600.0), (400.0, 3500.0, 4400.0)]
    figure = latency_figure(
        {"measured": points}, "t", "notes", failures=failures, warnings=warnings
    )
    assert warning_texts(figure)[0].startswith("warning: requests failed at 100/s: 72%")
    latency, failed = figure.axes
    assert latency.get_yscale() == "linear"  # 2.5-4.4 s: under a decade
    assert {line.get_label() for line in failed.get_lines()} >= {"503 (shed)", "other errors"}
    plt.close(figure)


def _limit_report(peak: float, others_busy: float, error_rate: float) -> LimitReport:
    spec = LimitSpec(Path("m.mar"), [Path("x")], 50.0, 8, 10, 1, [0.5], 3.0, 1.0)
    used = CoreUse(2, 0.2 + others_busy + 0.6, 0.2, 1.0, 2.0, 10.0)  # server: 12 ms x 50/s
    point = RatePoint(14.4, 50.0, 20.0, 40.0, error_rate, 30.0, 35.0, 1.5, used)
    limits = Bounds(35.6, 28.8, 55.0, 8, 20.0, 4)
    return LimitReport(spec, {1: {"all": 34.7}}, 1.0, "noop", limits, peak, 16, [point])


def test_every_warning_of_the_limit_report_is_drawn_on_its_plot() -> None:
    import matplotlib.pyplot as plt

    report = _limit_report(peak=80.3, others_busy=1.0, error_rate=0.2)
    warnings = limit_warnings(report)
    kinds = [w.split(" ")[0] for w in warnings]
    assert kinds == ["peak", "requests", "busy", "too"], warnings
    assert "2.79, above the ceiling" in warnings[0]
    text = markdown(report, "m.mar")
    assert all(f"- {w}" in text for w in warnings)
    points = [(p.offered, p.p50_ms, p.p99_ms) for p in report.points]
    figure = latency_figure({"server": points}, "t", "notes", warnings=warnings)
    drawn = " ".join(t.removeprefix("warning: ").strip() for t in warning_texts(figure))
    for warning in warnings:
        assert " ".join(warning.split()) in " ".join(drawn.split())
    plt.close(figure)


def test_a_quiet_run_draws_no_warning() -> None:
    import matplotlib.pyplot as plt

    quiet = _limit_report(peak=25.0, others_busy=0.0, error_rate=0.0)
    quiet = LimitReport(
        quiet.spec,
        quiet.costs,
        1.0,
        "noop",
        quiet.bounds,
        25.0,
        16,
        [RatePoint(14.4, 500.0, 20.0, 40.0, 0.0, 30.0, 35.0, 1.5)],
    )
    assert limit_warnings(quiet) == []
    figure = latency_figure({"server": [(14.4, 20.0, 40.0)]}, "t", "notes")
    assert warning_texts(figure) == []
    plt.close(figure)


def test_tune_and_sweep_plots_carry_their_warnings() -> None:
    import matplotlib.pyplot as plt

    row = {
        "Batch size": 4,
        "Batch delay": 5,
        "Workers": 2,
        "Precision": "fp32",
        "Concurrency": 1,
        "Requests": 300,
        "Failed requests": 30,
        "Throughput": 200.0,
        "Latency P99": 12.0,
        "Error rate": 0.1,
        "Error": "",
    }
    failed = {**row, "Batch size": 8, "Error": "no worker", "Latency P99": None}
    warnings = ["to fit the 5m00s budget, left out batch size 2", *row_warnings([row, failed])]
    assert any(w.startswith("did not start: b8-d5-w2-fp32") for w in warnings)
    assert any("b4-d5-w2-fp32 c1 10%" in w for w in warnings)
    assert any("fewer than 10 answers" in w for w in warnings)
    figure = throughput_figure([row, failed], "t", 50.0, None, warnings)
    assert len(warning_texts(figure)) == len(warnings)
    plt.close(figure)


def test_few_answers() -> None:
    assert few_answers(999) and not few_answers(1000)
