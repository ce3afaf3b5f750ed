"""The figures of a load run, as a JSON document and a printed table.

Throughput is goodput: successful (2xx, gRPC OK) answers per second; latency percentiles
describe successful answers only; everything else is counted as an error by kind.
"""

from __future__ import annotations

from typing import Any

from ferry_bench.arrivals import step_of
from ferry_bench.figures import few_answers
from ferry_bench.load import LoadResult, LoadSpec, Sample
from ferry_bench.stats import percentile


def _ms(value: float) -> float:
    return round(value, 3)


def load_summary(spec: LoadSpec, result: LoadResult) -> dict[str, Any]:
    succeeded = len(result.latencies_ms)
    errors = {str(status): n for status, n in sorted(result.statuses.items()) if status >= 300}
    errors.update(result.transport_errors)
    if result.dropped:
        errors["dropped"] = result.dropped
    latencies: dict[str, float | None] = {
        key: _ms(result.latency_ms(q)) if succeeded else None
        for key, q in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99))
    }
    summary: dict[str, Any] = {
        "url": spec.url,
        "mode": "closed" if spec.concurrency is not None else "open",
        "traffic": traffic(spec),
        "concurrency": spec.concurrency,
        "rate": spec.rate,
        "requests_sent": result.requests,
        "responses": result.answered,
        "succeeded": succeeded,
        "dropped": result.dropped,
        "seconds": round(result.seconds, 3),
        "goodput": round(result.throughput, 2),
        **latencies,
        "max_ms": _ms(max(result.latencies_ms)) if succeeded else None,
        "mean_ms": _ms(sum(result.latencies_ms) / succeeded) if succeeded else None,
        "statuses": {str(status): n for status, n in sorted(result.statuses.items())},
        "grpc_codes": dict(sorted(result.codes.items())),
        "errors": errors,
        "error_rate": round(result.error_rate, 5),
    }
    if spec.steps:
        summary["steps"] = step_figures(spec.steps, result.samples, result.arrivals_s)
    return summary


def traffic(spec: LoadSpec) -> str:
    """The load's shape in words: ``closed loop, 16 clients``, ``Poisson 200/s``..."""
    if spec.concurrency is not None:
        return f"closed loop, {spec.concurrency} clients"
    if spec.steps:
        return "Poisson in steps: " + ", ".join(f"{r:g}/s for {s:g} s" for r, s in spec.steps)
    if spec.bursts:
        on, off = spec.bursts
        return f"Poisson {spec.rate:g}/s in bursts: {on:g} s on, {off:g} s off"
    return f"Poisson {spec.rate:g}/s"


def window_figures(samples: list[Sample], sent: int, seconds: float) -> dict[str, Any]:
    """Goodput and success percentiles of the requests in one window of ``seconds``."""
    good = [s.latency_ms for s in samples if s.ok]
    return {
        "sent": sent,
        "succeeded": len(good),
        "goodput": round(len(good) / seconds, 2) if seconds > 0 else 0.0,
        "p50_ms": _ms(percentile(good, 50)) if good else None,
        "p99_ms": _ms(percentile(good, 99)) if good else None,
    }


def step_figures(
    steps: tuple[tuple[float, float], ...], samples: list[Sample], arrivals_s: list[float]
) -> list[dict[str, Any]]:
    """Each step's figures, requests counted in the step they were sent in."""
    figures = []
    for index, (rate, seconds) in enumerate(steps):
        mine = [s for s in samples if step_of(s.sent_s, steps) == index]
        sent = sum(1 for offset in arrivals_s if step_of(offset, steps) == index)
        figures.append({"rate": rate, "seconds": seconds, **window_figures(mine, sent, seconds)})
    return figures


def format_summary(summary: dict[str, Any]) -> str:
    succeeded, sent = summary["succeeded"], summary["requests_sent"]
    if succeeded:
        latency = (
            " / ".join(str(summary[key]) for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))
            + " ms (successful answers)"
        )
    else:
        latency = "none: no request succeeded"
    rows = [
        ("traffic", summary["traffic"]),
        ("goodput", f"{summary['goodput']} req/s (successful answers only)"),
        ("latency p50 / p90 / p99 / max", latency),
        ("succeeded", f"{succeeded} of {sent} sent ({summary['responses']} answered)"),
        ("errors", _errors(summary)),
    ]
    server = summary.get("server")
    if isinstance(server, dict):
        queue = server["queue_ms"]
        bound = " (bucket bounds)" if server.get("queue_is_bucket_bound") else ""
        rows.append(
            (
                "server queue p50 / p90 / p99",
                f"{queue['p50']} / {queue['p90']} / {queue['p99']} ms{bound}",
            )
        )
        rows.append(
            ("server batches", f"{server['batches']}, mean size {server['mean_batch_size']}")
        )
    elif isinstance(server, str):
        rows.append(("server figures", server))
    for step in summary.get("steps", []):
        rows.append(
            (
                f"step {step['rate']:g}/s, {step['seconds']:g} s",
                f"goodput {step['goodput']} req/s, p50 / p99 {step['p50_ms']} / "
                f"{step['p99_ms']} ms, {step['succeeded']} of {step['sent']} succeeded",
            )
        )
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def rate_table(summaries: list[dict[str, Any]]) -> str:
    """A rate sweep as Markdown: offered rate, goodput, percentiles and errors per rate."""
    lines = [
        "| offered (req/s) | goodput (req/s) | p50 ms | p90 ms | p99 ms | error rate |",
        "|---|---|---|---|---|---|",
    ]
    for item in summaries:
        lines.append(
            f"| {item['rate']:g} | {item['goodput']} | {item['p50_ms']} | {item['p90_ms']} | "
            f"{item['p99_ms']} | {item['error_rate']:.2%} |"
        )
    return "\n".join(lines)


def failure_shares(summaries: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per offered rate, the share of sent requests shed with 503 and the share that
    failed otherwise (other statuses, no answer, dropped)."""
    shed: list[tuple[float, float]] = []
    other: list[tuple[float, float]] = []
    for item in summaries:
        sent = item["requests_sent"] or 1
        shed_count = item["errors"].get("503", 0)
        failed_count = sum(item["errors"].values())
        shed.append((item["rate"], shed_count / sent))
        other.append((item["rate"], (failed_count - shed_count) / sent))
    return {"503 (shed)": shed, "other errors": other}


def rate_warnings(summaries: list[dict[str, Any]]) -> list[str]:
    """What a rate sweep's reader must know before trusting its latencies: the rates where
    requests failed (the latencies are of the survivors), and p99s on too few answers."""
    warnings = []
    failing = [s for s in summaries if s["error_rate"] > 0]
    if failing:
        listed = ", ".join(
            f"{s['rate']:g}/s: {s['error_rate']:.0%} ({_kinds(s['errors'])})" for s in failing
        )
        warnings.append(
            f"requests failed at {listed}; the latencies are of the successful answers only"
        )
    thin = [s for s in summaries if s["succeeded"] and few_answers(s["succeeded"])]
    if thin:
        listed = ", ".join(f"{s['rate']:g}/s ({s['succeeded']} answers)" for s in thin)
        warnings.append(
            f"p99 rests on fewer than 10 answers beyond it at {listed}: give a longer "
            "--duration or more --requests"
        )
    return warnings


def _kinds(errors: dict[str, int]) -> str:
    return ", ".join(f"{count} x {kind}" for kind, count in errors.items())


def _errors(summary: dict[str, Any]) -> str:
    if not summary["errors"]:
        return "none"
    listed = ", ".join(f"{kind}: {count}" for kind, count in summary["errors"].items())
    codes = summary.get("grpc_codes") or {}
    failing = {code: n for code, n in codes.items() if code != "OK"}
    if failing:
        listed += " (gRPC " + ", ".join(f"{code}: {n}" for code, n in failing.items()) + ")"
    return f"{listed}; error rate {summary['error_rate']:.2%}"
